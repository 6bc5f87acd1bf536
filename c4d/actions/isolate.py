"""Isolating a node: run an action's commands, never through a shell, logged, idempotent.

An action (``kubernetes``, ``slurm``, ``cmd:PATH``; modules beside this one) only says
which argv to run for a node and a diagnosis; this module runs them. Every command is a
list handed to ``subprocess.run(shell=False)``, so a node name or a diagnosis can never
become shell syntax; the node name is checked against a strict pattern before any argv is
built (``node_name.check``). ``dry_run`` prints each argv instead of running it. A node an
action has isolated is written to a ledger (JSON, replaced atomically), and isolating it
again is a logged no-op. Every outcome is logged and appended to a JSON-lines file.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from c4d.actions.base import Action, Command
from c4d.actions.node_name import BadNodeName, check

log = logging.getLogger("c4d.actions")

ISOLATED, ALREADY, DRY_RUN, REFUSED, FAILED = "isolated", "already-isolated", "dry-run", "refused", "failed"


@dataclass
class Outcome:
    action: str
    node: str
    status: str
    """isolated | already-isolated | dry-run | refused | failed."""
    message: str = ""
    commands: list[dict] = field(default_factory=list)
    """Each command run (or that would run): argv, exit status, the tail of its stderr."""
    at: float = field(default_factory=time.time)
    """Unix time of the outcome."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Ledger:
    """Which nodes each action has isolated: ``{"kubernetes": ["node-1"], ...}`` in a JSON file."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def read(self) -> dict[str, list[str]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("c4d: isolation ledger %s unreadable (%s); treating it as empty", self.path, e)
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(k): [str(n) for n in v] for k, v in data.items() if isinstance(v, list)}

    def has(self, action: str, node: str) -> bool:
        return node in self.read().get(action, [])

    def add(self, action: str, node: str) -> None:
        data = self.read()
        nodes = data.setdefault(action, [])
        if node in nodes:
            return
        nodes.append(node)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _short(arg: str, n: int = 48) -> str:
    return arg if len(arg) <= n else arg[: n - 1] + "…"


def _tail(text: str | bytes | None, n: int = 400) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text.strip()[-n:]


class Isolator:
    """Runs each configured action for a node once; see the module doc."""

    def __init__(
        self,
        actions: Sequence[Action],
        ledger: str | os.PathLike,
        journal: str | os.PathLike | None = None,
        dry_run: bool = False,
        timeout_s: float = 60.0,
        out: TextIO | None = None,
    ):
        self.actions = list(actions)
        self.ledger = Ledger(ledger)
        self.journal = Path(journal) if journal else None
        self.dry_run = dry_run
        self.timeout_s = timeout_s
        self.out = out or sys.stdout

    def isolate(self, node: str, diagnosis: Mapping[str, Any]) -> list[Outcome]:
        """Isolate ``node`` with every action; the diagnosis (docs/cli.md's JSON) is the evidence."""
        return [self._one(a, node, diagnosis) for a in self.actions]

    def _one(self, action: Action, node: str, diagnosis: Mapping[str, Any]) -> Outcome:
        try:
            check(node)
        except BadNodeName as e:
            return self._done(Outcome(action.name, node, REFUSED, str(e)))
        if self.ledger.has(action.name, node):
            return self._done(Outcome(action.name, node, ALREADY, "isolated before: nothing to do"))
        try:
            cmds = action.commands(node, diagnosis)
        except BadNodeName as e:
            return self._done(Outcome(action.name, node, REFUSED, str(e)))
        if self.dry_run:
            for c in cmds:
                print(f"c4d run: dry run: would run {json.dumps(list(c.argv))}", file=self.out, flush=True)
            argvs = [{"argv": list(c.argv)} for c in cmds]
            return self._done(Outcome(action.name, node, DRY_RUN, "nothing run (--dry-run)", argvs))
        ran: list[dict] = []
        for c in cmds:
            res = self._run(c)
            ran.append(res)
            if res["rc"] != 0:
                return self._done(Outcome(action.name, node, FAILED, res["error"], ran))
        self.ledger.add(action.name, node)
        return self._done(Outcome(action.name, node, ISOLATED, "", ran))

    def _run(self, c: Command) -> dict[str, Any]:
        exe = shutil.which(c.argv[0]) if os.sep not in c.argv[0] else c.argv[0]
        res: dict[str, Any] = {"argv": list(c.argv), "rc": None, "stderr": "", "error": ""}
        if exe is None:
            res.update(rc=127, error=f"{c.argv[0]} not found on PATH")
            return res
        try:
            p = subprocess.run(
                [exe, *c.argv[1:]],
                shell=False,
                input=c.stdin,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            res.update(
                rc=124, stderr=_tail(e.stderr), error=f"{c.argv[0]} timed out after {self.timeout_s:g} s"
            )
            return res
        except OSError as e:
            res.update(rc=126, error=f"{c.argv[0]}: {e.strerror or e}")
            return res
        res.update(rc=p.returncode, stderr=_tail(p.stderr))
        if p.returncode != 0:
            first = (_tail(p.stderr).splitlines() or [""])[-1]
            res["error"] = f"{c.argv[0]} exited with {p.returncode}" + (f": {first}" if first else "")
        return res

    def _done(self, o: Outcome) -> Outcome:
        what = {
            ISOLATED: logging.WARNING,
            ALREADY: logging.INFO,
            DRY_RUN: logging.WARNING,
            REFUSED: logging.ERROR,
            FAILED: logging.ERROR,
        }[o.status]
        cmds = "; ".join(" ".join(_short(a) for a in c["argv"]) for c in o.commands)
        log.log(what, "isolation %s of %s: %s%s%s", o.action, o.node, o.status,
                f" ({o.message})" if o.message else "", f" [{cmds}]" if cmds else "")  # fmt: skip
        if self.journal is not None:
            try:
                self.journal.parent.mkdir(parents=True, exist_ok=True)
                with open(self.journal, "a", encoding="utf-8") as f:
                    f.write(json.dumps(o.to_json()) + "\n")
            except OSError as e:
                log.error("c4d: cannot append to %s: %s", self.journal, e)
        return o
