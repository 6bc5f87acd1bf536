"""The supervisor loop: attempts, what ends them, what follows.

One attempt: start the job (``launcher``) with the shim preloaded, pointed at this run's
master (``diagnoses``), its output captured (``logs``); then, every ~0.1 s, step the
master and look at what happened:

* an ERROR diagnosis → stop the job; if it names a localized culprit node, wait (bounded)
  for the hang's stacks, write the evidence file, isolate the node (the blacklist, then
  every ``--isolate`` action); WARNING and INFO are recorded, never acted on (a hang
  WARNING starts the stack dumps, ``evidence``);
* every process exited → success or failure by their exit statuses;
* one process exited non-zero → the job failed: stop the rest;
* one process (or, from the ranks' FINAL heartbeats, one rank) exited 0 and the rest did
  not follow within ``--job-exit-hang-interval`` → stop (exit hang);
* no output for ``--job-hang-interval`` → stop (hang seen in the logs), after dumping the
  stacks of the job's ranks into the attempt's evidence (``evidence.dump_job``).

Then ``policy.decide`` says whether to start again. The job learns its history from
``C4D_RESTART_COUNT`` and ``C4D_PROC_START_COUNT``, and which nodes to avoid from
``C4D_EXCLUDE_NODES_FILE`` (the blacklist; ``c4d sim`` reads it). A ``c4d run`` whose
own node has been isolated starts nothing more.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from c4d.actions import blacklist
from c4d.actions.base import Action
from c4d.actions.isolate import Isolator, Outcome
from c4d.record import names
from c4d.run import launcher
from c4d.run.diagnoses import Endpoint, JsonFollower, LocalMaster
from c4d.run.evidence import Evidence, evidence_path
from c4d.run.logs import LogCapture
from c4d.run.policy import (
    Attempt,
    Decision,
    End,
    PolicyConfig,
    compile_patterns,
    decide,
    is_retryable,
    signature,
)
from c4d.util import signals

log = logging.getLogger("c4d.run")


@dataclass
class RunConfig:
    argv: list[str]
    run_dir: Path
    node: str = field(default_factory=socket.gethostname)
    nprocs: int = 1
    log_file: Path | None = None
    blacklist: Path | None = None
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    job_hang_interval: float = 1800.0
    job_exit_hang_interval: float = 600.0
    keep_on_failure: float = 0.0
    grace_s: float = 10.0
    isolate: list[Action] = field(default_factory=list)
    dry_run: bool = False
    master: str | None = None
    diagnoses_from: str | None = None
    bind: str = "tcp://127.0.0.1:*"
    engine_overrides: dict[str, Any] = field(default_factory=dict)
    trace: str | None = None
    preload: bool = True
    evidence_wait_s: float = 20.0
    live: bool = False
    agent: bool = True
    """with ``master``: the ranks send to a node agent hosted here (c4d/agent) on ``bind``,
    which summarises and forwards to the master; False: they send to the master directly"""

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        self.log_file = Path(self.log_file or self.run_dir / "job.log")
        self.blacklist = Path(self.blacklist or self.run_dir / "blacklist.txt")


@dataclass
class AttemptRecord:
    """An attempt as the summary tells it."""

    attempt: Attempt
    seconds: float
    errors: list[dict[str, Any]] = field(default_factory=list)
    """The ERROR diagnoses that ended it (with their stacks)."""
    actions: list[dict[str, Any]] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    decision: Decision | None = None


class Supervisor:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        assert cfg.blacklist is not None and cfg.log_file is not None
        cfg.blacklist.parent.mkdir(parents=True, exist_ok=True)
        cfg.blacklist.touch(exist_ok=True)
        self.run_id = f"run{uuid.uuid4().hex[:8]}"
        self.patterns = compile_patterns(cfg.policy.retryable)
        self.capture = LogCapture(cfg.log_file, cfg.node, passthrough=not cfg.live)
        self.isolator = Isolator(
            cfg.isolate, cfg.run_dir / "isolated.json", cfg.run_dir / "actions.jsonl", dry_run=cfg.dry_run
        )
        self.job: launcher.Job | None = None
        self.evidence = Evidence(
            lambda: self.job.tree() if self.job else set(), error_wait_s=cfg.evidence_wait_s
        )
        self.records: list[AttemptRecord] = []
        self.view: Any = None
        self._endpoint: Endpoint | None = None  # bound at the first attempt, kept to the end
        self._agent: Any = None  # the node agent (with an external master), kept to the end
        if cfg.master and cfg.agent:  # a bad endpoint is bad input: the caller prints one line
            from c4d.agent.agent import Agent, AgentConfig

            self._agent = Agent(AgentConfig(master=cfg.master, bind=cfg.bind))
            log.info("c4d run: node agent on %s, forwarding to %s", self._agent.endpoint, cfg.master)
        self._trace: str | None = None
        self._pids: Any = None  # the current source's rank → pid lookup
        self._diag_log = open(cfg.run_dir / "diagnoses.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    # -- the whole run -------------------------------------------------------------------
    def run(self) -> int:
        try:
            while True:
                idx = len(self.records) + 1
                try:
                    rec = self._attempt(idx)
                except KeyboardInterrupt as e:  # outside the watch loop: waiting for stacks, isolating
                    if self.job is not None:
                        self.job.stop(self.cfg.grace_s)
                    rec = AttemptRecord(
                        Attempt(idx, End.interrupted, _signal_status(str(e)), "interrupted"), 0.0
                    )
                self.records.append(rec)
                rec.decision = decide(self.cfg.policy, [r.attempt for r in self.records])
                verb = "restarting" if rec.decision.restart else "not restarting"
                self.capture.note(
                    f"attempt {rec.attempt.index}: {rec.attempt.end.value}; {verb}: {rec.decision.why}"
                )
                log.warning("c4d run: attempt %d %s; %s: %s", rec.attempt.index, rec.attempt.end.value, verb,
                            rec.decision.why)  # fmt: skip
                if not rec.decision.restart:
                    break
        finally:
            self._close_view()
            if self._endpoint is not None:
                self._endpoint.close()
            if self._agent is not None:
                self._agent.flush()
                self._agent.close()
        status = self._exit_status()
        self._summary(status)
        last = self.records[-1]
        if last.decision and last.decision.failed and self.cfg.keep_on_failure > 0:
            self._keep()
        self.capture.close()
        self.evidence.close()
        self._diag_log.close()
        return status

    def _exit_status(self) -> int:
        a = self.records[-1].attempt
        if a.end is End.succeeded:
            return 0
        if a.end is End.interrupted:
            return a.exit_status or 130
        if a.end is End.not_started:
            return a.exit_status if a.exit_status is not None else 2
        if a.end is End.failed:
            return a.exit_status or 1
        return a.exit_status or 2  # stopped by c4d: the job's status, never 0

    # -- one attempt ---------------------------------------------------------------------
    def _attempt(self, idx: int) -> AttemptRecord:
        cfg = self.cfg
        assert cfg.blacklist is not None
        if cfg.node in blacklist.read_nodes(cfg.blacklist):
            why = f"this node ({cfg.node}) is isolated (listed in {cfg.blacklist})"
            return AttemptRecord(Attempt(idx, End.not_started, None, "isolated", detail=why), 0.0)
        self.evidence.new_attempt()
        source = self._source(idx)
        endpoint = source.endpoint if isinstance(source, LocalMaster) else self._agent_endpoint()
        env = self._env(idx, endpoint)
        self.capture.start_attempt(f"attempt {idx} starts: {json.dumps(cfg.argv)}")
        t0 = time.monotonic()
        try:
            self.job = launcher.launch(cfg.argv, env, cfg.nprocs, self.capture)
        except OSError as e:
            if source is not None:
                source.close()
            why = f"cannot start {cfg.argv[0]}: {e.strerror or e}"
            print(f"c4d run: {why}", file=sys.stderr)
            return AttemptRecord(Attempt(idx, End.not_started, 1, "not-started", detail=why), 0.0)
        rec = AttemptRecord(Attempt(idx, End.failed), 0.0)
        try:
            end, extra = self._watch(source, rec)
        except KeyboardInterrupt as e:
            end, extra = End.interrupted, str(e)
        if end is End.c4d_error:  # before the stop: the dumps need the processes alive
            self._await_evidence(rec)
        elif end is End.log_hang:
            self._log_hang_evidence(idx, rec)
        stopped = end not in (End.succeeded, End.failed) or any(rc is None for rc in self.job.poll())
        rcs = self.job.stop(cfg.grace_s) if stopped else self.job.poll()
        self.capture.join(2.0)
        statuses = [launcher.exit_status(rc) for rc in rcs]
        status = next((s for s in statuses if s), 0)
        if end is End.interrupted:
            status = _signal_status(extra)
        isolated: tuple[str, ...] = ()
        if end is End.c4d_error:
            isolated = self._act(idx, rec)
        if source is not None:
            source.close()
        if self._trace:
            from c4d.util.stacks_view import sidecar_path

            self.evidence.write_sidecar(sidecar_path(self._trace))
        tail = self.capture.tail()
        retry = is_retryable(status, tail, self.patterns) if end is End.failed else None
        rec.attempt = Attempt(idx, end, status, signature(end, status, tail, extra), retry, isolated, extra)
        rec.seconds = round(time.monotonic() - t0, 3)
        return rec

    def _source(self, idx: int):
        cfg = self.cfg
        if cfg.master:
            return JsonFollower(cfg.diagnoses_from) if cfg.diagnoses_from else None
        trace = None
        if cfg.trace:
            t = Path(cfg.trace)
            trace = str(t.with_name(f"{t.stem}.attempt{idx}{t.suffix}"))
        meta = {"command": "run", "job": self.run_id, "attempt": idx, "argv": cfg.argv, "node": cfg.node}
        if self._endpoint is None:
            self._endpoint = Endpoint(cfg.bind)
        else:
            self._endpoint.drain()
        src = LocalMaster(
            cfg.bind,
            cfg.engine_overrides,
            trace,
            meta,
            self.evidence.enrich,
            self._heard,
            collector=self._endpoint.collector,
        )
        self._trace = trace
        if cfg.live:
            self._show(src)
        return src

    def _agent_endpoint(self) -> str | None:
        """Where the ranks send when the master is external: this node's agent (kept across
        restarts like the hosted master's endpoint), or the master itself (--no-agent)."""
        return self._agent.endpoint if self._agent is not None else self.cfg.master

    def _heard(self, d: Any) -> None:
        """Every diagnosis of the local master, in its thread, stacks included when known."""
        self.evidence.on_diagnosis(d, self._pids() if self._pids else None)

    def _env(self, idx: int, endpoint: str | None) -> dict[str, str]:
        from c4d.util import native

        cfg = self.cfg
        env = dict(os.environ)
        if cfg.preload:
            lib = str(native.lib_path())
            pre = env.get("LD_PRELOAD", "")
            if lib not in pre.split(":"):
                env["LD_PRELOAD"] = lib + (":" + pre if pre else "")
            env.setdefault("NCCL_PROFILER_PLUGIN", "STATIC_PLUGIN")
            if "C4D_LIBZMQ" not in env and (zmq_lib := native.libzmq_path()) is not None:
                env["C4D_LIBZMQ"] = str(zmq_lib)
        if endpoint:
            env["C4D_MASTER_ADDR"] = endpoint
        env.update(
            C4D_RUN_ID=self.run_id,
            C4D_RESTART_COUNT=str(idx - 1),
            C4D_PROC_START_COUNT=str(idx),
            C4D_EXCLUDE_NODES_FILE=str(cfg.blacklist),
            C4D_PTRACER_PID=str(os.getpid()),
        )
        return env

    def _watch(self, source, rec: AttemptRecord) -> tuple[End, str]:
        """Poll until the attempt ends; (how, a few words on why)."""
        cfg, job = self.cfg, self.job
        assert job is not None
        self._pids = source.pids if source is not None else None
        first_final: float | None = None
        while True:
            signals.check()  # a SIGTERM whose KeyboardInterrupt a destructor swallowed
            if self._agent is not None:  # receives for up to 0.05 s, forwards what is due
                self._agent.step(timeout_s=0.05)
            if source is not None:
                diags = source.poll(0.05 if self._agent is not None else 0.1)
            else:
                diags = []
                if self._agent is None:
                    time.sleep(0.1)
            errors = [d for d in diags if self._record(d, source) == "ERROR"]
            if self.view is not None:
                self.view.update()
            if errors:
                rec.errors.extend(errors)
                d = errors[0]
                return End.c4d_error, f"{d.get('kind')}"
            rcs = job.poll()
            if all(rc is not None for rc in rcs):
                return (End.succeeded, "") if all(rc == 0 for rc in rcs) else (End.failed, "")
            if any(rc not in (None, 0) for rc in rcs):
                return End.failed, ""
            now = time.monotonic()
            done0 = [t for i, t in job.exited_at.items() if rcs[i] == 0]
            if source is not None:
                final, registered = source.final_ranks()
                pending = bool(final) and bool(registered - final)  # a rank is done, others are not
                first_final = (first_final or now) if pending else None
            started = min([*done0, *([first_final] if first_final else [])], default=None)
            if started is not None and now - started > cfg.job_exit_hang_interval:
                what = "a process" if done0 else "a rank"
                log.error("c4d run: %s exited successfully and the rest did not follow in %g s: exit hang",
                          what, cfg.job_exit_hang_interval)  # fmt: skip
                return End.exit_hang, ""
            if self.capture.silent_for() > cfg.job_hang_interval:
                log.error("c4d run: no output from the job for %g s: hang", cfg.job_hang_interval)
                return End.log_hang, f"no output for {cfg.job_hang_interval:g} s"

    def _record(self, d: dict[str, Any], source) -> str:
        """Keep a diagnosis (the run's diagnoses.jsonl; stacks for an external master's); its level."""
        if isinstance(source, JsonFollower):
            self.evidence.on_diagnosis(d)
            d = self.evidence.enrich(d)
        try:
            self._diag_log.write(json.dumps(d) + "\n")
            self._diag_log.flush()
        except OSError as e:
            log.error("c4d run: cannot write diagnoses.jsonl: %s", e)
        return str(d.get("level"))

    # -- acting on an ERROR ----------------------------------------------------------------
    def _await_evidence(self, rec: AttemptRecord) -> None:
        """Give the hang's stack dumps up to --evidence-wait seconds, then attach what they found."""
        for n, d in enumerate(rec.errors):
            if self.evidence.stacks_for(d, wait_s=self.cfg.evidence_wait_s) is not None:
                rec.errors[n] = self.evidence.enrich(d)

    def _log_hang_evidence(self, idx: int, rec: AttemptRecord) -> None:
        """A hang seen in the logs names no rank: the stacks of the job's ranks (of its
        processes, when it sets no RANK), into the attempt's evidence, before the job is stopped."""
        cfg = self.cfg
        detail: dict[str, Any] = {"silent_s": cfg.job_hang_interval, "log": str(cfg.log_file)}
        what = {
            "time": time.time(),
            "level": "ERROR",
            "kind": End.log_hang.value,
            "ranks": [],
            "nodes": [cfg.node],
            "detail": detail,
        }
        st = self.evidence.dump_job(what, self._pids() if self._pids else None, cfg.evidence_wait_s)
        ev = evidence_path(cfg.run_dir, idx, End.log_hang.value, [cfg.node])
        try:
            ev.parent.mkdir(parents=True, exist_ok=True)
            ev.write_text(json.dumps({**what, "detail": {**detail, "stacks": st}}, indent=1))
        except OSError as e:
            log.error("c4d run: cannot write the evidence file %s: %s", ev, e)
            return
        rec.evidence.append(str(ev))

    def _act(self, idx: int, rec: AttemptRecord) -> tuple[str, ...]:
        """Isolate the localized culprit nodes of the attempt's ERRORs, with the evidence."""
        cfg = self.cfg
        assert cfg.blacklist is not None
        isolated: list[str] = []
        for n, d in enumerate(rec.errors):
            detail = dict(d.get("detail") or {})
            nodes = [x for x in d.get("nodes") or [] if x and x != "?"]
            refused = set(detail.get("refused_nodes") or ())  # names a diagnosis file had unsafe
            # the master says whether the ERROR isolates (hardware named at C4D_ISOLATE_CONFIDENCE);
            # a diagnosis from an older master only whether it localized
            isolates = detail.get("isolates", detail.get("localized"))
            if not (isolates and nodes):
                log.warning("c4d run: %s names no node sure enough to isolate", d.get("kind"))
                continue
            ev = evidence_path(cfg.run_dir, idx, d.get("kind"), nodes)
            d = {**d, "detail": {**detail, "evidence_file": str(ev)}}
            rec.errors[n] = d
            ev.parent.mkdir(parents=True, exist_ok=True)
            ev.write_text(json.dumps(d, indent=1))
            rec.evidence.append(str(ev))
            for node in nodes:
                if node in refused or not names.is_clean(node):
                    why = "the diagnosis named it in a form no master sends (not a safe node name)"
                    self._journal_blacklist(node, "refused", why)
                    act = {"action": "blacklist", "node": node, "status": "refused", "message": why}
                    rec.actions.append(act)
                    continue
                added = blacklist.append_nodes(cfg.blacklist, [node])
                listed = bool(added) or node in blacklist.read_nodes(cfg.blacklist)
                status = "isolated" if added else "already-isolated" if listed else "refused"
                self._journal_blacklist(node, status)
                outcomes: list[Outcome] = self.isolator.isolate(node, d)
                rec.actions.extend(o.to_json() for o in outcomes)
                if listed and node not in isolated:
                    isolated.append(node)
        return tuple(isolated)

    def _journal_blacklist(self, node: str, status: str, message: str = "") -> None:
        cfg = self.cfg
        why = f": {message}" if message else ""
        log.warning("c4d run: blacklist %s: %s (%s)%s", node, status, cfg.blacklist, why)
        entry = {
            "action": "blacklist",
            "node": node,
            "status": status,
            "file": str(cfg.blacklist),
            "at": time.time(),
        }
        if message:
            entry["message"] = message
        with open(cfg.run_dir / "actions.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    # -- the end -------------------------------------------------------------------------
    def _summary(self, status: int) -> None:
        from c4d.run.summary import render, to_json

        cfg = self.cfg
        data = to_json(self, status)
        (cfg.run_dir / "summary.json").write_text(json.dumps(data, indent=1))
        print(render(data), file=sys.stderr, flush=True)

    def _keep(self) -> None:
        s = self.cfg.keep_on_failure
        print(f"c4d run: the job failed; keeping its environment for {s:g} s for inspection "
              f"(run dir {self.cfg.run_dir}; Ctrl-C ends it)", file=sys.stderr, flush=True)  # fmt: skip
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(s)

    # -- live view (in-process master only) ------------------------------------------------
    def _show(self, src: LocalMaster) -> None:
        if self.view is None:
            from rich.logging import RichHandler

            from c4d.master.live import LiveView

            self.view = LiveView(src.master)
            # log lines print above the live display, not through it
            handler = RichHandler(console=self.view.console, show_path=False, show_time=False, markup=False)
            logging.basicConfig(
                level=logging.getLogger().level, handlers=[handler], format="%(message)s", force=True
            )
        else:
            self.view.master = src.master

    def _close_view(self) -> None:
        if self.view is not None:
            self.view.close()
            self.view = None


def _signal_status(text: str) -> int:
    """128 + the signal that interrupted ``c4d run`` ("signal 15" from its handler; else SIGINT)."""
    m = re.search(r"signal (\d+)", text)
    return 128 + (int(m.group(1)) if m else int(signal.SIGINT))
