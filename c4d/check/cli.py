"""``c4d check {boot,nccl,troubleshoot,nodes}``: argument parsing and printing only.

Exit status of every sub-command, as for every c4d command (docs/cli.md): 0 every check
passed; 1 the check could not run (bad arguments, nccl-tests binary missing, torch missing for
``nodes``, nothing that could be checked on this node for ``troubleshoot``); 2 a check failed
(or, for ``nodes``, a failure could not be localized).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
from pathlib import Path

from c4d.actions import blacklist
from c4d.check.result import CheckResult, Status, emit
from c4d.cli_common import EXIT_HELP, HelpFormatter, number

EXIT_OK, EXIT_FAILED, EXIT_CANNOT_RUN = 0, 2, 1
# checks that exercise the node (versions are only read); troubleshoot vouches for a node
# only when one of these ran and passed
VERIFYING = ("DiskTest", "AllReduceTest", "NCCLTest", "GPUTest")


_positive_int = number(int, at_least=1)
_node_count = number(int, at_least=2, hint="a node check needs at least 2 nodes")
_nonneg_float = number(float, at_least=0)
_positive_float = number(float, above=0)
_factor = number(float, above=1, hint="a multiple of the median")
_count = number(int, at_least=0)


def _blacklist(path: str | None, nodes: list[str]) -> list[str] | None:
    """Add ``nodes`` to the blacklist file (the engine's format); the whole list, or None if
    nothing was asked."""
    if not path or not nodes:
        return None
    blacklist.append_nodes(path, nodes)
    return blacklist.read_nodes(path)


def node_name() -> str:
    return os.environ.get("C4D_NODE_NAME") or socket.gethostname()


# ---------------------------------------------------------------- boot


def _add_boot_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("boot checks")
    g.add_argument(
        "--disk", action="append", default=[], metavar="PATH", help="folder to disk-test (repeatable)"
    )
    g.add_argument("--disk-mb", type=_positive_int, default=64, help="MiB written per disk test (default 64)")
    g.add_argument(
        "--min-disk-write-mbs", type=_nonneg_float, default=0.0, metavar="MB/S", help="fail a disk below this"
    )
    g.add_argument(
        "--min-disk-read-mbs", type=_nonneg_float, default=0.0, metavar="MB/S", help="fail a disk below this"
    )
    g.add_argument("--expect-gpus", type=_count, metavar="N", help="fail unless exactly N GPUs are visible")
    g.add_argument(
        "--expect-cuda", metavar="VER", help="fail unless the CUDA version is VER (prefix, e.g. 12.4)"
    )
    g.add_argument("--expect-torch", metavar="VER", help="fail unless the PyTorch version is VER (prefix)")
    g.add_argument("--expect-nccl", metavar="VER", help="fail unless the NCCL version is VER (prefix)")
    g.add_argument("--no-allreduce", action="store_true", help="skip the all-reduce correctness check")
    g.add_argument(
        "--allreduce-procs",
        type=_positive_int,
        metavar="N",
        help="ranks of the all-reduce (default: GPUs, or 2 on CPU)",
    )
    g.add_argument(
        "--allreduce-backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="auto: nccl with GPUs, else gloo",
    )
    g.add_argument(
        "--allreduce-timeout",
        type=_positive_float,
        default=60.0,
        metavar="S",
        help="fail a rank that has not joined by then",
    )


def _boot_options(args):
    from c4d.check.boot import BootOptions

    return BootOptions(
        disks=tuple(args.disk),
        disk_bytes=args.disk_mb << 20,
        min_disk_write_mbs=args.min_disk_write_mbs,
        min_disk_read_mbs=args.min_disk_read_mbs,
        expect_gpus=args.expect_gpus,
        expect_cuda=args.expect_cuda,
        expect_torch=args.expect_torch,
        expect_nccl=args.expect_nccl,
        allreduce=not args.no_allreduce,
        allreduce_procs=args.allreduce_procs,
        allreduce_backend=args.allreduce_backend,
        allreduce_timeout_s=args.allreduce_timeout,
    )


def _printer(as_json: bool):
    return lambda r: emit([r], as_json, sys.stdout)


def cmd_boot(args) -> int:
    from c4d.check.boot import boot_checks

    results = boot_checks(_boot_options(args), on_result=_printer(args.json))
    if not all(r.ok for r in results):
        return EXIT_FAILED
    if not any(_checked(r) for r in results):  # a pass would vouch for a node nothing looked at
        skipped = ", ".join(f"{r.name} {r.target}".strip() for r in results if r.status is Status.SKIPPED)
        print(
            f"c4d check boot: nothing was checked on this node: every check was skipped or only read a "
            f"value ({skipped or 'none asked'}); give --disk DIR, or run where torch (the all-reduce) "
            "or a GPU is",
            file=sys.stderr,
        )
        return EXIT_CANNOT_RUN
    return EXIT_OK


def _checked(r: CheckResult) -> bool:
    """The result checked something: it exercised the node, or held a value against an expectation."""
    return r.status is Status.SUCCEED and (r.name in VERIFYING or r.threshold is not None)


# ---------------------------------------------------------------- nccl


def _add_nccl_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("NCCL bandwidth (nccl-tests)")
    g.add_argument(
        "--from", dest="from_file", metavar="FILE", help="read a saved nccl-tests output (- for stdin)"
    )
    g.add_argument(
        "--test",
        action="append",
        metavar="BINARY",
        help="nccl-tests binary to run (repeatable; default all_reduce_perf)",
    )
    g.add_argument("--nccl-tests-dir", metavar="DIR", help="folder holding the binaries (default: PATH)")
    g.add_argument(
        "--min-busbw", type=_nonneg_float, metavar="GB/S", help="fail below this average bus bandwidth"
    )
    g.add_argument(
        "--gpus", type=_positive_int, metavar="N", help="-g for the binaries (default: GPUs visible)"
    )
    g.add_argument("--nccl-args", metavar="ARGS", help="arguments for the binaries, replacing the defaults")
    g.add_argument(
        "--launcher", metavar="CMD", help="prefix such as 'mpirun -np 16 -npernode 8 --hostfile H'"
    )
    g.add_argument(
        "--nccl-timeout", type=_positive_float, default=900.0, metavar="S", help="kill a run after S s"
    )


def _nccl_outcomes(args, for_troubleshoot: bool):
    """Outcomes, or an int exit status after printing why nothing ran. In troubleshoot mode a
    missing binary is a Failed (or, with no GPU, Skipped) check instead."""
    from c4d.check import nccl

    if args.from_file:
        try:
            if args.from_file == "-":
                text = sys.stdin.read()
            else:
                with open(args.from_file, encoding="utf-8", errors="replace") as f:
                    text = f.read()
        except OSError as e:
            print(f"c4d check: cannot read {args.from_file}: {e.strerror or e}", file=sys.stderr)
            return EXIT_CANNOT_RUN
        return nccl.from_text(args.from_file, text, args.min_busbw)

    def visible() -> int:
        from c4d.check.dist import import_torch
        from c4d.check.env import gpus

        return len(gpus(import_torch()[0])[0])

    try:
        binaries = [nccl.find_binary(n, args.nccl_tests_dir) for n in args.test or ["all_reduce_perf"]]
    except nccl.BinaryMissing as e:
        if not for_troubleshoot:
            print(f"c4d check nccl: {e}", file=sys.stderr)
            return EXIT_CANNOT_RUN
        n = args.gpus if args.gpus is not None else visible()
        status = Status.FAILED if n else Status.SKIPPED
        return CheckResult("NCCLTest", "", status, None, None, str(e) if n else f"no GPU and {e}")
    gpus = args.gpus if args.gpus is not None or args.nccl_args else visible()
    return nccl.run_tests(
        binaries, gpus or 1, args.min_busbw, args.nccl_timeout, args.nccl_args, args.launcher
    )


def cmd_nccl(args) -> int:
    outcomes = _nccl_outcomes(args, for_troubleshoot=False)
    if isinstance(outcomes, int):
        return outcomes
    for o in outcomes:
        if args.json:
            print(json.dumps(o.to_json()), flush=True)
            continue
        if o.run is not None and not args.no_table and not o.run.rows.empty:
            from rich.console import Console

            from c4d.check.nccl import rows_table

            Console(file=sys.stdout, width=120).print(rows_table(o.run))
        emit([o.result()], False, sys.stdout)
    if args.write_expected:
        return _write_expected(args, outcomes)
    return EXIT_OK if all(o.passed for o in outcomes) else EXIT_FAILED


def _write_expected(args, outcomes) -> int:
    """Only runs that passed describe healthy links; the file keeps other classes' entries."""
    from c4d.engine.expected import ExpectedBusbw, ExpectedError

    good = [o.run for o in outcomes if o.passed and o.run is not None]
    if not good:
        print(f"c4d check nccl: no passing run to write {args.write_expected} from", file=sys.stderr)
        return EXIT_FAILED
    from c4d.formats.nccl_tests import COLLECTIVES

    named = COLLECTIVES.get(Path(args.test[0]).name) if args.test else None
    table = ExpectedBusbw.from_nccl_tests(good, args.link_class, named)
    if not table.table:
        print("c4d check nccl: the output does not name its binary; say which with --test all_reduce_perf "
              "(or another)", file=sys.stderr)  # fmt: skip
        return EXIT_CANNOT_RUN
    path = Path(args.write_expected)
    if path.exists():
        try:
            table = ExpectedBusbw.load(path).merged(table)
        except ExpectedError as e:
            print(f"c4d check nccl: {e} (not overwritten)", file=sys.stderr)
            return EXIT_CANNOT_RUN
    table.save(path)
    n = sum(len(v) for v in table.table.values())
    print(f"c4d check nccl: wrote {path} ({n} sizes; c4d master --expected-busbw {path})", file=sys.stderr)
    return EXIT_OK if len(good) == len(outcomes) else EXIT_FAILED


# ---------------------------------------------------------------- troubleshoot


def cmd_troubleshoot(args) -> int:
    from c4d.check.boot import boot_checks

    results = boot_checks(_boot_options(args), on_result=_printer(args.json))
    outcomes = _nccl_outcomes(args, for_troubleshoot=True)
    if isinstance(outcomes, int):
        return outcomes
    nccl_results = [outcomes] if isinstance(outcomes, CheckResult) else [o.result() for o in outcomes]
    for r in nccl_results:
        _printer(args.json)(r)
    results += nccl_results
    passed = all(r.ok for r in results)
    verified = [r for r in results if r.status is Status.SUCCEED and r.name in VERIFYING]
    skipped = [f"{r.name} {r.target}".strip() for r in results if r.status is Status.SKIPPED]
    name = args.node_name or node_name()
    failed_nodes = [] if passed else [name]
    listed = _blacklist(args.blacklist, failed_nodes)
    unchecked = passed and not verified  # nothing exercised the node: no verdict either way
    if args.json:
        summary = {
            "summary": True,
            "passed": passed and not unchecked,
            "checked": len(verified),
            "skipped": skipped,
            "node": name,
            "failed_nodes": failed_nodes,
            "failed_checks": [f"{r.name} {r.target}".strip() for r in results if not r.ok],
            "blacklist": listed,
        }
        print(json.dumps(summary), flush=True)
    elif unchecked:
        print(
            f"Check Finished, nothing verified on {name}: every check that exercises the node was "
            f"skipped ({', '.join(skipped) or 'none asked'}); not restarting on an unchecked node "
            "(give --disk DIR, run the all-reduce (needs torch) or nccl-tests)"
        )
    elif passed:
        if skipped:
            print(f"Not checked here (skipped): {', '.join(skipped)}")
        print("Check Finished, task will be restarted.")  # the seed platform's line, verbatim
    else:
        failed = ", ".join(f"{r.name} {r.target}".strip() for r in results if not r.ok)
        print(f"Check Finished, failed nodes: {name} (failed: {failed})")
        if listed is not None:
            print(f"Blacklist {args.blacklist}: {', '.join(listed)}")
    if unchecked:
        return EXIT_CANNOT_RUN
    return EXIT_OK if passed else EXIT_FAILED


# ---------------------------------------------------------------- nodes


def _group_line(g) -> CheckResult:
    target = f"round {g.round} {'+'.join(g.nodes)}"
    if g.ok:
        gemm = ", ".join(f"{n} {t * 1e3:.1f}" for n, t in g.gemm_s.items())
        detail = f"{g.time_s * 1e3:.1f} ms per GEMM + all-gather; GEMM ms: {gemm}"
        return CheckResult("NodeCheck", target, Status.SUCCEED, g.time_s, None, detail)
    detail = "; ".join(f"{n}: {e}" for n, e in g.errors.items())
    return CheckResult("NodeCheck", target, Status.FAILED, None, None, detail)


def _verdict_line(v, factor: float) -> CheckResult:
    from c4d.check.pairing import NodeStatus

    status = {
        NodeStatus.OK: Status.SUCCEED,
        NodeStatus.STRAGGLER: Status.FAILED,
        NodeStatus.FAULTY: Status.FAILED,
        NodeStatus.UNRESOLVED: Status.UNKNOWN,
    }[v.status]
    if v.status is NodeStatus.OK:
        detail = f"{v.time_s * 1e3:.1f} ms" + (
            f", {v.ratio:.2f}x its round's median" if v.ratio is not None else ""
        )
    else:
        detail = f"{v.status.value}: {v.reason}"
    return CheckResult("NodeCheck", v.node, status, v.time_s, {"straggler_factor": factor}, detail)


def cmd_nodes(args) -> int:
    from c4d.check import multihost
    from c4d.check.dist import import_torch
    from c4d.check.nodes import CheckUnavailable, NodeCheckConfig, run_node_check

    launch = None
    if not args.local:
        try:
            launch = multihost.detect(os.environ, args.rdzv_endpoint, args.nodes, args.node_rank)
        except multihost.LaunchError as e:
            print(f"c4d check nodes: {e}", file=sys.stderr)
            return EXIT_CANNOT_RUN
    torch, why = import_torch()
    if torch is None:
        print(f"c4d check nodes: {why}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    if launch is not None and launch.rank != 0:
        return _serve_nodes(args, launch)
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    on_gpu = backend == "nccl"
    nodes = launch.world if launch else args.nodes or (torch.cuda.device_count() if on_gpu else 4)
    # simulated nodes share this machine's cores, so their groups go one at a time; hosts don't
    sequential = not on_gpu and launch is None
    cfg = NodeCheckConfig(
        nodes=nodes,
        backend=backend,
        straggler_factor=args.straggler_factor,
        gemm_size=args.gemm_size or (8192 if on_gpu else 256),
        allgather_bytes=int((args.allgather_mb or (256 if on_gpu else 1)) * (1 << 20)),
        iters=args.iters,
        timeout_s=args.timeout,
        max_rounds=args.max_rounds,
        parallel_groups=args.parallel_groups if args.parallel_groups is not None else int(sequential),
    )
    on_group = None if args.json else lambda g: emit([_group_line(g)], False, sys.stdout)
    coordinator = None
    try:
        if launch is None:
            report = run_node_check(cfg, on_group=on_group)
        else:
            name = multihost.node_name(args.node_name)
            coordinator = multihost.Coordinator(cfg, launch, name, args.join_timeout)
            on_join = None if args.json else lambda j, n, d: _join_lines(launch, args.join_timeout, j, n, d)
            report = coordinator.run(on_join=on_join, on_group=on_group)
    except (CheckUnavailable, ValueError, multihost.MultiHostError) as e:
        print(f"c4d check nodes: {e}", file=sys.stderr)
        _abandon(coordinator)
        return EXIT_CANNOT_RUN
    except BaseException:
        _abandon(coordinator)
        raise
    code = EXIT_OK if report.passed else EXIT_FAILED
    try:
        _print_nodes_report(args, report)
    finally:
        if coordinator is not None:
            missing = coordinator.finish(report, code)
            coordinator.close()
            if missing:
                print(f"c4d check nodes: rank(s) {', '.join(map(str, missing))} did not take their stop",
                      file=sys.stderr)  # fmt: skip
    return code


def _abandon(coordinator) -> None:
    """Let the other ranks go (status 1) before this one fails; the store may be gone too."""
    if coordinator is not None:
        with contextlib.suppress(Exception):
            coordinator.finish(None, EXIT_CANNOT_RUN)
        with contextlib.suppress(Exception):
            coordinator.close()


def _join_lines(launch, join_timeout: float, joined: dict, names: list[str], died: dict) -> None:
    """The rendezvous, as lines: one per rank that did not join or start, then who joined."""
    lines = []
    for r, n in enumerate(names):
        if n in died:
            lines.append(
                CheckResult("NodeCheck", f"join {n}", Status.FAILED, None, None, f"rank {r} {died[n]}")
            )
    ok = [n for n in names if n not in died]
    detail = (
        f"{len(ok)} of {launch.world} ranks joined through {launch.how} at {launch.host}:{launch.port}: "
        + ", ".join(ok)
    )
    status = Status.SUCCEED if len(ok) == launch.world else Status.FAILED
    lines.append(CheckResult("NodeCheck", "join", status, len(ok), launch.world, detail))
    emit(lines, False, sys.stdout)


def _serve_nodes(args, launch) -> int:
    """Rank R > 0 of a multi-host check: run this node's groups; rank 0 prints the result. The
    exit status is the check's; a line on stderr when this node did not pass or the check broke."""
    from c4d.check import multihost

    name = multihost.node_name(args.node_name)
    try:
        stop = multihost.serve(launch, name, args.join_timeout)
    except multihost.MultiHostError as e:
        print(f"c4d check nodes: rank {launch.rank} ({name}): {e}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    v = stop.get("verdict") or {}
    if v.get("status") not in (None, "ok"):
        print(f"c4d check nodes: {v.get('node')} (rank {launch.rank}): {v['status']}: {v.get('reason')}",
              file=sys.stderr)  # fmt: skip
    code = stop.get("exit")
    return code if code in (EXIT_OK, EXIT_FAILED, EXIT_CANNOT_RUN) else EXIT_CANNOT_RUN


def _write_report(path: str, obj: dict) -> None:
    """The JSON report, replaced atomically (never half-written)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def _print_nodes_report(args, report) -> None:
    loc = report.localization
    cfg = report.config
    to_list = [n for n in (*loc.faulty, *loc.stragglers) if n not in report.unnamed]
    listed = _blacklist(args.blacklist, to_list)
    obj = {**report.to_json(), "blacklist": listed}
    if args.report:
        try:
            _write_report(args.report, obj)
        except OSError as e:
            print(f"c4d check nodes: cannot write {args.report}: {e.strerror or e}", file=sys.stderr)
    if args.json:
        print(json.dumps(obj), flush=True)
    else:
        emit([_verdict_line(v, cfg.straggler_factor) for v in loc.verdicts], False, sys.stdout)
        if loc.faulty:
            print(f"Faulty nodes: {', '.join(loc.faulty)}")
        if loc.stragglers:
            print(f"Stragglers (> {cfg.straggler_factor:g}x median): {', '.join(loc.stragglers)}")
        if loc.unresolved:
            print(f"Unresolved (cannot localize): {', '.join(loc.unresolved)}")
        for note in loc.notes:
            print(f"Note: {note}")
        if report.passed:
            print(f"All {len(report.nodes)} nodes passed.")
        if listed is not None:
            print(f"Blacklist {args.blacklist}: {', '.join(listed)}")


# ---------------------------------------------------------------- registration


def add_parser(subparsers) -> None:
    """Register ``check`` and its sub-commands on the top-level ``c4d`` sub-parsers."""

    def parser(parent, name: str, help: str, description: str | None = None):
        return parent.add_parser(
            name,
            help=help,
            description=(description or help) + "\n\n" + EXIT_HELP,
            formatter_class=HelpFormatter,
        )

    check = parser(subparsers, "check", "node health checks: boot, nccl, troubleshoot, nodes",
                   "Node health checks before a job starts and after it fails.")  # fmt: skip
    sub = check.add_subparsers(
        dest="check_command",
        metavar="{boot,nccl,troubleshoot,nodes}",
        required=True,
        parser_class=type(check),
    )

    p = parser(sub, "boot", "disks, GPUs, CUDA/PyTorch/NCCL versions, an all-reduce")
    _add_boot_args(p)
    p.add_argument("--json", action="store_true", help="one JSON object per check")
    p.set_defaults(func=cmd_boot)

    p = parser(sub, "nccl", "NCCL bandwidth through nccl-tests (or a saved output)")
    _add_nccl_args(p)
    p.add_argument(
        "--write-expected",
        metavar="FILE",
        help="write (merge into) FILE the busbw per collective and size, for c4d master --expected-busbw",
    )
    p.add_argument(
        "--link-class",
        choices=("auto", "intra", "net"),
        default="auto",
        help="the link class of these runs (auto: net when the devices were on more than one host)",
    )
    p.add_argument("--no-table", action="store_true", help="print only the verdict line")
    p.add_argument("--json", action="store_true", help="one JSON object per run")
    p.set_defaults(func=cmd_nccl)

    p = parser(
        sub,
        "troubleshoot",
        "after a failure: boot checks + NCCL bandwidth",
        "After a failure: the boot checks and the NCCL bandwidth check, then the node's verdict. "
        "A node on which nothing could be exercised (every disk, all-reduce and bandwidth check "
        "skipped) gets no verdict and exit status 1.",
    )
    _add_boot_args(p)
    _add_nccl_args(p)
    p.add_argument("--node-name", help="this node's name (default: $C4D_NODE_NAME or the hostname)")
    p.add_argument("--blacklist", metavar="FILE", help="add this node to FILE when a check fails")
    p.add_argument("--json", action="store_true", help="one JSON object per check, then a summary object")
    p.set_defaults(func=cmd_troubleshoot)

    p = parser(
        sub,
        "nodes",
        "pairwise GEMM + all-gather rounds that isolate a bad or straggling node",
        "Simulated nodes node-0..node-(N-1): local gloo processes on CPU, one GPU each "
        "with NCCL; or, under torchrun/srun or with --rdzv-endpoint, one worker per host. "
        "Faults can be injected with C4D_CHECK_SIM_FAULT (see docs/check.md).",
    )
    p.add_argument(
        "--nodes", type=_node_count, metavar="N", help="number of nodes (default: GPUs, or 4 on CPU)"
    )
    p.add_argument(
        "--backend", choices=("auto", "gloo", "nccl"), default="auto", help="auto: nccl with GPUs, else gloo"
    )
    p.add_argument(
        "--straggler-factor",
        type=_factor,
        default=2.0,
        metavar="K",
        help="a node is a straggler when its time exceeds K x its round's median (default 2)",
    )
    p.add_argument(
        "--gemm-size", type=_positive_int, metavar="N", help="N x N GEMM (default 256 CPU, 8192 GPU)"
    )
    p.add_argument(
        "--allgather-mb", type=_positive_float, metavar="MB", help="per-rank all-gather MiB (1 CPU, 256 GPU)"
    )
    p.add_argument("--iters", type=_positive_int, default=10, help="timed iterations per group (median kept)")
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=30.0,
        metavar="S",
        help="a group that has not formed in S s fails",
    )
    p.add_argument(
        "--max-rounds", type=_positive_int, default=4, help="round 1 plus re-test rounds (default 4)"
    )
    p.add_argument(
        "--parallel-groups",
        type=_count,
        metavar="N",
        help="groups of a round run at once, 0 = all (default: all on GPUs; 1 on CPU, where the "
        "simulated nodes share the cores)",
    )
    p.add_argument("--blacklist", metavar="FILE", help="add faulty nodes and stragglers to FILE")
    p.add_argument("--json", action="store_true", help="one JSON object with every verdict and group")
    p.add_argument("--report", metavar="FILE", help="also write that JSON object to FILE (rank 0)")
    g = p.add_argument_group(
        "several hosts",
        "One worker per host, ranks from torchrun's or srun's environment (RANK/WORLD_SIZE/"
        "MASTER_ADDR/MASTER_PORT, SLURM_PROCID/SLURM_NTASKS/SLURM_STEP_NODELIST), or from "
        "--rdzv-endpoint; rank 0 prints the result (docs/check.md).",
    )
    g.add_argument(
        "--rdzv-endpoint",
        metavar="HOST:PORT",
        help="rank 0's host and a free port; with --nodes and --node-rank",
    )
    g.add_argument(
        "--node-rank",
        type=_count,
        metavar="R",
        help="this host's rank, 0..N-1 (default $JOB_COMPLETION_INDEX)",
    )
    g.add_argument(
        "--node-name", help="this node's name (default: $C4D_NODE_NAME, $SLURMD_NODENAME, the hostname)"
    )
    g.add_argument(
        "--join-timeout",
        type=_positive_float,
        default=120.0,
        metavar="S",
        help="a rank that has not joined by then is named and left out (default 120)",
    )
    g.add_argument("--local", action="store_true", help="simulate the nodes here even under torchrun or srun")
    p.set_defaults(func=cmd_nodes)
