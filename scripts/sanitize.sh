#!/usr/bin/env bash
# Sanitizer runs of the native code (CI: .ci/run). Builds libc4d.so, simnccl and c4d-simtrain
# with AddressSanitizer + UndefinedBehaviorSanitizer, then with ThreadSanitizer, each into its own
# folder (the normal build in c4d/_native is untouched), and runs the sim scenarios below on each
# build: real rank processes on simnccl with the sanitized shim preloaded. Any report fails the run
# (ASan aborts; UBSan halts on its first error; TSan makes the process exit 66).
#
#   scripts/sanitize.sh [address|thread]...     (default: both)
#
# What runs (docs/reliability.md, "Sanitizers"): the shim's end-to-end tests (a TP x PP job, every
# collective verified, groups, lifecycle, no master, malformed variables, a hung rank's
# heartbeats, delivery) and its fault tests (master killed and restarted, 16 threads on 16
# communicators, abort/destroy with ops in flight, fork, an NCCL without optional symbols), plus
# simnccl's own tests under ASan+UBSan. About 5 minutes on 2 cores, builds included.
set -euo pipefail
cd "$(dirname "$0")/.."
kinds=("$@")
[ ${#kinds[@]} -eq 0 ] && kinds=(address thread)

SHIM_TESTS=(tests/test_shim.py tests/test_reliability_shim.py tests/test_edge_shim_delivery.py)
# Timing tests measure the normal build; under a sanitizer they would measure the sanitizer.
NOT_TIMED="not never_reads_leaves_step_time and not exit_with_records_queued and not exit_flush_of_zero"
# TSan is 5-15x slower: the scenarios with the most threads, lifecycle events and faults.
TSAN_SET="tp2_pp2 or verify_passes or bcast or lifecycle or lock_free or restarted or sixteen or abort"
TSAN_SET="$TSAN_SET or optional or absent or nothing_listening"

run_tests() {  # kind runtime out pytest-args...
  local kind=$1 runtime=$2 out=$3
  shift 3
  # setarch -R: TSan's shadow memory wants the classic address layout (high-entropy ASLR breaks it).
  # verify_asan_link_order=0: c4d sim's ranks preload the shim ahead of the runtime that their own
  # instrumented executable loads; processes the tests start themselves put the runtime first.
  C4D_NATIVE_DIR="$out" C4D_TEST_PRELOAD_PREFIX="$runtime" \
    ASAN_OPTIONS="detect_leaks=0:verify_asan_link_order=0" \
    UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    TSAN_OPTIONS="suppressions=$PWD/native/shim/tsan.supp:halt_on_error=0:exitcode=66" \
    setarch "$(uname -m)" -R python -m pytest -q -p no:cacheprovider "$@"
}

for kind in "${kinds[@]}"; do
  case "$kind" in
    address) flags="address,undefined" runtime=$(${CC:-gcc} -print-file-name=libasan.so) ;;
    thread) flags="thread" runtime=$(${CC:-gcc} -print-file-name=libtsan.so) ;;
    *) echo "sanitize.sh: unknown sanitizer '$kind' (address or thread)" >&2; exit 1 ;;
  esac
  out="$PWD/build-san-$kind/native"
  echo "== $kind: building into $out"
  cmake -S . -B "build-san-$kind" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DC4D_SANITIZE="$flags" \
    -DC4D_OUT="$out" >/dev/null
  cmake --build "build-san-$kind" -j2 >/dev/null
  if [ "$kind" = address ]; then
    echo "== address: shim scenarios"
    run_tests address "$runtime" "$out" "${SHIM_TESTS[@]}" -k "$NOT_TIMED"
    # simnccl's tests load it into the test process itself: the interpreter gets the runtime first
    echo "== address: simnccl"
    LD_PRELOAD="$runtime" run_tests address "$runtime" "$out" tests/test_simnccl.py
  else
    echo "== thread: shim scenarios"
    run_tests thread "$runtime" "$out" "${SHIM_TESTS[@]}" -k "$NOT_TIMED and ($TSAN_SET)"
  fi
done
echo "== sanitizers: no reports"
