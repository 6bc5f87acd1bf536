"""The boot check: disks, GPUs, versions and an all-reduce, in that order (cheap checks first,
so a node with a read-only disk says so before any process group starts)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from c4d.check.allreduce import allreduce_check
from c4d.check.disk import disk_test
from c4d.check.dist import import_torch
from c4d.check.env import env_checks
from c4d.check.result import CheckResult


@dataclass(frozen=True)
class BootOptions:
    disks: tuple[str, ...] = ()
    disk_bytes: int = 64 << 20
    min_disk_write_mbs: float = 0.0
    min_disk_read_mbs: float = 0.0
    expect_gpus: int | None = None
    expect_cuda: str | None = None
    expect_torch: str | None = None
    expect_nccl: str | None = None
    allreduce: bool = True
    allreduce_procs: int | None = None
    allreduce_backend: str = "auto"
    allreduce_timeout_s: float = 60.0


def boot_checks(
    opts: BootOptions, on_result: Callable[[CheckResult], None] | None = None
) -> list[CheckResult]:
    """Every boot check; ``on_result`` sees each result as soon as it exists (live output)."""
    results: list[CheckResult] = []

    def add(r: CheckResult) -> None:
        results.append(r)
        if on_result:
            on_result(r)

    for path in opts.disks:
        add(disk_test(path, opts.disk_bytes, opts.min_disk_write_mbs, opts.min_disk_read_mbs))
    torch, why = import_torch()
    for r in env_checks(torch, why, opts.expect_gpus, opts.expect_cuda, opts.expect_torch, opts.expect_nccl):
        add(r)
    if opts.allreduce:
        add(allreduce_check(opts.allreduce_procs, opts.allreduce_backend, opts.allreduce_timeout_s))
    return results
