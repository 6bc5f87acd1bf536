"""The commands that serve a job: ``lib`` (the shim's path, for LD_PRELOAD), ``master`` (one per
job: collects, diagnoses, acts), ``agent`` (one per node: summarises and forwards to the master)
and ``keygen`` (the master's CURVE keys)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable

from c4d.cli.common import (
    add_command,
    add_master_opts,
    live_console,
    make_master,
    setup_logging,
)
from c4d.cli_common import EXIT_BAD, EXIT_FOUND, EXIT_OK, found, log_level, number, positive


def add_parser(subparsers) -> None:
    """``lib``, ``master``, ``keygen`` and ``agent``."""
    _add_lib(subparsers)
    _add_master(subparsers)
    _add_keygen(subparsers)
    _add_agent(subparsers)


def _add_lib(subparsers) -> None:
    p = add_command(subparsers, "lib", "print the absolute path of libc4d.so (for LD_PRELOAD)")
    p.set_defaults(func=cmd_lib)


def _add_master(subparsers) -> None:
    p = add_command(
        subparsers,
        "master",
        "collect records from the ranks, diagnose, act",
        "One per job: collects every rank's records over ZeroMQ, diagnoses, logs one line per "
        "incident, writes the trace and the blacklist. Exits 2 if it diagnosed anything at WARNING "
        "or above.",
    )
    p.add_argument(
        "--bind",
        default=os.environ.get("C4D_MASTER_ADDR", "tcp://127.0.0.1:5555"),
        metavar="EP",
        help="ZeroMQ endpoint to listen on; tcp://0.0.0.0:5555 accepts ranks on other hosts "
        "(default: $C4D_MASTER_ADDR, else tcp://127.0.0.1:5555, this host only)",
    )
    p.add_argument(
        "--engine-process",
        action="store_true",
        default=None,
        help="run the diagnosis engine in a process of its own: receiving and validating and the "
        "engine take two cores (jobs of thousands of ranks; diagnoses reach the log a tick later; "
        "default: $C4D_MASTER_ENGINE_PROCESS)",
    )
    p.add_argument(
        "--receiver-process",
        action="store_true",
        default=None,
        help="receive in a process of its own: the socket, decoding and the job's check take a "
        "core beside the master's loop (jobs of tens of thousands of ranks; default: "
        "$C4D_MASTER_RECEIVER_PROCESS)",
    )
    p.add_argument(
        "--engine-shards",
        type=number(int, at_least=1),
        default=None,
        metavar="N",
        help="split the engine's communicators over N processes, the cross-communicator judges "
        "joined in one (the same diagnoses; jobs of tens of thousands of ranks on a master with "
        "cores to spare); N > 1 puts the engine in a process of its own (default: "
        "$C4D_ENGINE_SHARDS, else the cores less two, at most 4, when the engine has a process)",
    )
    p.add_argument(
        "--curve",
        metavar="KEYDIR",
        help="ZeroMQ CURVE: only senders holding the public key in KEYDIR (c4d keygen) get in; "
        "encrypted (docs/reliability.md)",
    )
    p.add_argument(
        "--job",
        metavar="JOB",
        help="serve only this job id (the ranks' C4D_JOB_ID, TORCHELASTIC_RUN_ID or SLURM_JOB_ID); "
        "default: the first job heard",
    )
    p.add_argument(
        "--ranks-may-move",
        action="store_true",
        help="the job's launcher may restart a rank on another node (default: a restarted rank must "
        "register on its first node; $C4D_RANKS_MAY_MOVE=1; docs/reliability.md)",
    )
    p.add_argument(
        "--status-bind",
        default="auto",
        metavar="EP",
        help="answer status requests (c4d sim --master learns the verdicts there) on EP; auto: the port "
        "below --bind's (ipc: PATH.status); none: nowhere (default: auto)",
    )
    add_master_opts(p)
    p.set_defaults(func=cmd_master)


def _add_keygen(subparsers) -> None:
    p = add_command(
        subparsers,
        "keygen",
        "write a CURVE key pair for c4d master --curve",
        "Writes DIR/master.key_secret (the master's) and DIR/master.key (the job's, for "
        "C4D_CURVE_SERVER_KEY), both mode 0600, DIR 0700; never overwrites a key.",
    )
    p.add_argument("dir", metavar="DIR", help="key directory (created when missing)")
    p.set_defaults(func=cmd_keygen)


def _add_agent(subparsers) -> None:
    p = add_command(
        subparsers,
        "agent",
        "per-node aggregator: the node's ranks send here, it summarises and forwards to the master",
        "One per node, for jobs that `c4d run` does not launch (c4d run hosts one itself): point the "
        "ranks' C4D_MASTER_ADDR at --bind. Collectives of communicators that live on this node reach "
        "the master as one summary each; everything else is forwarded (docs/deploy.md). Runs until "
        "SIGINT/SIGTERM; exit 0, or 1 when an endpoint is bad.",
    )
    p.add_argument("--master", required=True, metavar="EP", help="the master's endpoint (c4d master --bind)")
    p.add_argument(
        "--bind",
        default="tcp://127.0.0.1:5556",
        metavar="EP",
        help="endpoint the node's ranks send to (their C4D_MASTER_ADDR)",
    )
    p.add_argument(
        "--trace", metavar="FILE", help="keep the node's full stream in this trace (c4d analyze reads it)"
    )
    p.add_argument(
        "--flush-ms",
        type=positive(int),
        metavar="MS",
        help="forward to the master this often (default: by the job's size, 100 ms up to 1,000 nodes and "
        "longer beyond, within one heartbeat: all agents send the master at most 10,000 messages a second)",
    )
    p.add_argument(
        "--job",
        metavar="JOB",
        help="serve only this job id, refusing any other from the first message (default: $C4D_JOB_ID, "
        "$TORCHELASTIC_RUN_ID or $SLURM_JOB_ID; none: the first job --agree ranks register with)",
    )
    p.add_argument(
        "--agree",
        type=positive(int),
        default=2,
        metavar="N",
        help="with no job named: ranks that must register with one job before it is served (default 2; "
        "$C4D_AGENT_AGREE)",
    )
    p.add_argument(
        "--master-status",
        default="auto",
        metavar="EP",
        help="the master's status endpoint, asked which job it serves: a job it refuses is not forwarded "
        "(auto: the port below --master's, as c4d master --status-bind auto; none: not asked)",
    )
    p.add_argument(
        "--log-level",
        type=log_level,
        default=logging.INFO,
        metavar="L",
        help="Debug, Info, Warning or Error",
    )
    p.set_defaults(func=cmd_agent)


def cmd_lib(args) -> int:
    from c4d.util import native

    try:
        print(native.lib_path())
    except native.NativeMissing as e:
        print(f"c4d: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_master(args) -> int:
    from c4d.master.curve import CurveKeyError

    setup_logging(args.log_level)
    stop = _stop_on_signals()
    try:
        m = make_master(args, {"command": "master"}, args.bind)
    except CurveKeyError as e:  # --curve KEYDIR: no keys, or a secret key others can read
        print(f"c4d master: {e}", file=sys.stderr)
        return EXIT_BAD
    except (OSError, ValueError) as e:  # each says what failed: the endpoint, the trace, the metrics port
        print(f"c4d master: {e}", file=sys.stderr)
        return EXIT_BAD
    print(f"c4d master listening on {m.endpoint}", file=sys.stderr, flush=True)
    if m.status is not None:
        print(f"c4d master answers status requests on {m.status.endpoint}", file=sys.stderr, flush=True)
    view = None
    try:
        if args.live:
            from c4d.master.live import LiveView

            view = LiveView(m, console=live_console(args), log_level=args.log_level)
            logging.getLogger("c4d").info("master listening on %s", m.endpoint)
        m.run(should_stop=stop, on_step=view.update if view else None)
    except KeyboardInterrupt:
        pass
    finally:
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: stop now
            m.drain()  # what the job sent before the stop
        m.finish()
        if view is not None:
            view.close()
        m.close()
    return EXIT_FOUND if found(m.diagnoses) else EXIT_OK


def cmd_agent(args) -> int:
    from c4d.agent.agent import Agent, AgentConfig

    setup_logging(args.log_level)
    stop = _stop_on_signals()  # between two steps: a flush in progress completes
    cfg = AgentConfig(master=args.master, bind=args.bind, trace=args.trace, job=args.job, agree=args.agree,
                      flush_s=args.flush_ms / 1000 if args.flush_ms else None,
                      master_status=None if args.master_status == "none" else args.master_status)  # fmt: skip
    try:
        a = Agent(cfg)
    except (OSError, ValueError) as e:  # zmq errors are OSErrors: a bad or busy endpoint
        print(f"c4d agent: {e}", file=sys.stderr)
        return EXIT_BAD
    print(f"c4d agent listening on {a.endpoint}, forwarding to {args.master}", file=sys.stderr, flush=True)
    try:
        a.run(should_stop=stop)
    except KeyboardInterrupt:
        pass
    finally:
        a.flush()
        a.close()
        st = a.stats
        ss = a.summary.stats
        logging.getLogger("c4d").info(
            "agent: %d record(s) in, %d forwarded (%d ops summarised into %d; %d heartbeats and %d "
            "in-flight peer reports merged), %d dropped",
            ss["in"], st["forwarded"], ss["ops summarised"], ss["summaries"], ss["heartbeats merged"],
            ss["peer reports merged"], st["dropped"],
        )  # fmt: skip
    return EXIT_OK


def cmd_keygen(args) -> int:
    from c4d.master import curve

    try:
        pub, sec = curve.generate(args.dir)
    except (curve.CurveKeyError, OSError) as e:
        print(f"c4d keygen: {e}", file=sys.stderr)
        return EXIT_BAD
    print(f"wrote {sec} (the master's: c4d master --curve {args.dir})")
    print(f"wrote {pub} (the job's: C4D_CURVE_SERVER_KEY={pub})")
    return EXIT_OK


def _stop_on_signals() -> Callable[[], bool]:
    """SIGINT/SIGTERM/SIGHUP ask a serving loop to stop between two steps (the returned test);
    a second one unwinds at once. An exception raised wherever the signal lands (inside a logging
    handler, the live view's console lock) can leave a lock taken that the shutdown then waits on."""
    import signal

    asked: list[int] = []

    def handler(signum, _frame):
        if asked:
            raise KeyboardInterrupt(f"signal {signum}")
        asked.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
    return lambda: bool(asked)
