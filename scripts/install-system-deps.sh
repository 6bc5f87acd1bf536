#!/usr/bin/env bash
# Installs what building c4d's native part and running its tests needs on Debian/Ubuntu:
# a C++ compiler, CMake, tmux (the live-view test) and gdb (c4d run's native stacks of hung
# ranks). Nothing is installed when all are present,
# so it also works offline on a prepared machine. No system libzmq is needed: the shim loads
# the libzmq that ships inside pyzmq's wheel.
set -euo pipefail
need=()
command -v g++ >/dev/null || need+=(g++)
command -v cmake >/dev/null || need+=(cmake)
command -v make >/dev/null || need+=(make)
command -v tmux >/dev/null || need+=(tmux)
command -v gdb >/dev/null || need+=(gdb)
if ((${#need[@]})); then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
