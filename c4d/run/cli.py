"""``c4d run [options] -- CMD ...``: the options, their defaults and help texts.

``add_parser(subparsers)`` is all ``c4d/cli/__init__.py`` calls; ``cmd_run`` turns the options into
a ``RunConfig`` (bad input: one line on stderr, exit status 1) and runs the supervisor.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys

from c4d.cli_common import log_level, number, positive
from c4d.run.policy import RETRYABLE_PATTERNS, Policy, PolicyConfig, compile_patterns
from c4d.util import signals

EPILOG = """\
exit status: the job's own (0 when its last attempt succeeded); 1: bad options or nothing
could be started; 2: c4d stopped the job and did not restart it (or this node is isolated)
and the job's status was 0. Files: RUN_DIR/job.log (every line of the job, timestamped),
diagnoses.jsonl, blacklist.txt, isolated.json, actions.jsonl, evidence/, summary.json.
See docs/run.md."""


_seconds = number(float, at_least=0)
_count = number(int, at_least=0)
_positive = positive(int)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "run",
        help="launch a job with the shim preloaded and supervise it (restarts, hangs, isolation)",
        description="Launch CMD with libc4d.so preloaded and a master for it, and supervise it: "
        "restart policy, hang and exit-hang detection, stacks of hung ranks, node isolation.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("restart policy")
    g.add_argument(
        "--fault-tolerant-policy",
        choices=[x.value for x in Policy],
        default=Policy.ExitCodeAndErrorMsg.value,
        help="OnFailure: restart after any failure; ExitCodeAndErrorMsg (default): only after a "
        "retryable one (SIGKILL/SIGBUS, or a retryable error in the log's tail); Never",
    )
    g.add_argument("--max-restarts", type=_count, default=3, metavar="N", help="restarts at most (default 3)")
    g.add_argument(
        "--retryable-error",
        action="append",
        default=[],
        metavar="PATTERN",
        help="a regular expression that makes a failure retryable when it matches a line of the "
        f"log's tail (repeatable; added to {len(RETRYABLE_PATTERNS)} built-in NCCL/CUDA/network patterns)",
    )
    g.add_argument(
        "--max-same-error",
        type=_positive,
        default=10,
        metavar="N",
        help="the same error N times in a row marks the job failed (default 10)",
    )
    g.add_argument(
        "--keep-on-failure",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="after a final failure, wait this long before exiting, for inspection (default 0)",
    )
    g = p.add_argument_group("hangs")
    g.add_argument(
        "--job-hang-interval",
        type=_seconds,
        default=1800.0,
        metavar="SECONDS",
        help="no output from the job for this long: stop and restart it (default 1800)",
    )
    g.add_argument(
        "--job-exit-hang-interval",
        type=_seconds,
        default=600.0,
        metavar="SECONDS",
        help="a process or rank exited successfully and the rest did not follow within this: stop "
        "and restart (default 600)",
    )
    g.add_argument(
        "--grace-period",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="stopping the job: SIGTERM, then SIGKILL after this (default 10)",
    )
    g.add_argument(
        "--evidence-wait",
        type=_seconds,
        default=20.0,
        metavar="SECONDS",
        help="before stopping on an ERROR, wait at most this long for the hung ranks' stacks (default 20)",
    )
    g = p.add_argument_group("isolation")
    g.add_argument(
        "--isolate",
        action="append",
        default=[],
        metavar="ACTION",
        help="on an ERROR naming a node, besides the blacklist: kubernetes (kubectl cordon + taint), "
        "slurm (scontrol drain) or cmd:PATH (PATH NODE DIAGNOSIS_JSON); repeatable",
    )
    g.add_argument(
        "--dry-run", action="store_true", help="print the isolation commands instead of running them"
    )
    g.add_argument(
        "--blacklist",
        metavar="FILE",
        help="isolated nodes, one a line; the job sees it as $C4D_EXCLUDE_NODES_FILE "
        "(default RUN_DIR/blacklist.txt)",
    )
    g = p.add_argument_group("the job")
    g.add_argument(
        "--run-dir",
        default=os.environ.get("C4D_RUN_DIR", "c4d-run"),
        metavar="DIR",
        help="where the log, the diagnoses, the evidence and the summary go "
        "(default $C4D_RUN_DIR or ./c4d-run)",
    )
    g.add_argument("--log-file", metavar="FILE", help="the job's timestamped log (default RUN_DIR/job.log)")
    g.add_argument(
        "--node-name",
        default=os.environ.get("C4D_NODE_NAME") or socket.gethostname(),
        metavar="NAME",
        help="this node's name in the log and the blacklist (default $C4D_NODE_NAME or the host name)",
    )
    g.add_argument(
        "--nprocs",
        type=_positive,
        default=1,
        metavar="N",
        help="start N copies of CMD (LOCAL_RANK=0..N-1; default 1)",
    )
    g.add_argument("--no-preload", action="store_true", help="do not preload libc4d.so")
    g = p.add_argument_group("master")
    g.add_argument(
        "--master",
        metavar="EP",
        help="ranks report to this running master (through this node's agent, hosted by c4d run on "
        "--bind) instead of one hosted by c4d run; c4d diagnoses then reach c4d run only through "
        "--diagnoses-from",
    )
    g.add_argument(
        "--no-agent",
        action="store_true",
        help="with --master: the ranks send to the master directly, not through this node's agent",
    )
    g.add_argument(
        "--diagnoses-from",
        metavar="FILE",
        help="with --master: the JSON lines that master writes (`c4d master --json > FILE`)",
    )
    g.add_argument(
        "--bind",
        default="tcp://127.0.0.1:*",
        metavar="EP",
        help="endpoint of the hosted master, or with --master of the node agent the ranks send to; kept "
        "across restarts (default tcp://127.0.0.1:*, a free port)",
    )
    g.add_argument("--trace", metavar="FILE", help="the hosted master writes each attempt's trace to FILE "
                   "with .attemptN before its suffix, and the hung ranks' stacks beside it")  # fmt: skip
    g.add_argument(
        "--live", action="store_true", help="show the live view (the job's output then goes to the log only)"
    )
    g.add_argument(
        "--hang-timeout", type=_positive, metavar="US", help="override the job's C4D_HANG_TIMEOUT (µs)"
    )
    g.add_argument("--hang-times", type=_positive, metavar="N", help="override the job's C4D_HANG_TIMES")
    g.add_argument(
        "--log-level",
        type=log_level,
        default=logging.WARNING,
        metavar="L",
        help="c4d's own log on stderr: info, warning (default) or error",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...: the job")
    p.set_defaults(func=cmd_run)
    return p


def _fail(text: str) -> int:
    print(f"c4d run: {text}", file=sys.stderr)
    return 1


def config(args):
    """RunConfig from parsed options; ValueError with a one-line reason for bad input."""
    from c4d.actions.factory import parse_actions
    from c4d.run.supervisor import RunConfig

    compile_patterns(args.retryable_error)  # a bad pattern is bad input: one line, status 1
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ValueError("no command: c4d run [options] -- CMD ...")
    if args.nprocs < 1:
        raise ValueError("--nprocs must be ≥ 1")
    if args.diagnoses_from and not args.master:
        raise ValueError(
            "--diagnoses-from goes with --master (the hosted master's diagnoses arrive by themselves)"
        )
    if args.no_agent and not args.master:
        raise ValueError("--no-agent goes with --master (the hosted master is this node's aggregator)")
    if args.live and args.master:
        raise ValueError("--live needs the hosted master (not --master)")
    policy = PolicyConfig(
        policy=Policy(args.fault_tolerant_policy),
        max_restarts=args.max_restarts,
        max_same_error=args.max_same_error,
        retryable=RETRYABLE_PATTERNS + tuple(args.retryable_error),
    )
    return RunConfig(
        argv=cmd,
        run_dir=args.run_dir,
        node=args.node_name,
        nprocs=args.nprocs,
        log_file=args.log_file,
        blacklist=args.blacklist,
        policy=policy,
        job_hang_interval=args.job_hang_interval,
        job_exit_hang_interval=args.job_exit_hang_interval,
        keep_on_failure=args.keep_on_failure,
        grace_s=args.grace_period,
        isolate=parse_actions(args.isolate),
        dry_run=args.dry_run,
        master=args.master,
        diagnoses_from=args.diagnoses_from,
        bind=args.bind,
        engine_overrides={
            k: v for k, v in (("hang_timeout_us", args.hang_timeout), ("hang_times", args.hang_times)) if v
        },
        trace=args.trace,
        preload=not args.no_preload,
        evidence_wait_s=args.evidence_wait,
        live=args.live,
        agent=not args.no_agent,
    )


def cmd_run(args) -> int:
    from c4d.run.supervisor import Supervisor
    from c4d.util.native import NativeMissing

    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="c4d %(levelname)s %(message)s", force=True
    )
    try:
        cfg = config(args)
    except ValueError as e:
        return _fail(str(e))
    signals.raise_on_signals()
    try:
        sup = Supervisor(cfg)
    except (OSError, ValueError) as e:
        return _fail(str(e))
    try:
        return sup.run()
    except NativeMissing as e:
        return _fail(str(e))
