"""The final summary: attempts, why each ended, the nodes isolated and the evidence.

``to_json`` is what ``summary.json`` in the run directory holds; ``render`` prints it for
a person, on stderr, when ``c4d run`` ends.
"""

from __future__ import annotations

import re
from typing import Any

# what must not reach a terminal raw: C0/C1 controls (ESC sequences, newlines that forge log
# lines), DEL, and Unicode line separators and bidirectional overrides
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def safe(text: Any) -> str:
    """``text`` for a terminal: every control character written as an escape (``\\x1b``)."""
    return _UNSAFE.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}",
        str(text),
    )


def to_json(sup: Any, status: int) -> dict[str, Any]:
    attempts = []
    isolated: list[str] = []
    for r in sup.records:
        a = r.attempt
        for n in a.isolated:
            if n not in isolated:
                isolated.append(n)
        attempts.append(
            {
                "attempt": a.index,
                "ended": a.end.value,
                "exit_status": a.exit_status,
                "seconds": r.seconds,
                "signature": a.signature,
                "retryable": a.retryable,
                "detail": a.detail,
                "errors": [_brief(d) for d in r.errors],
                "isolated": list(a.isolated),
                "actions": r.actions,
                "evidence": r.evidence,
                "decision": {"restart": r.decision.restart, "why": r.decision.why} if r.decision else None,
            }
        )
    return {
        "node": sup.cfg.node,
        "run_id": sup.run_id,
        "argv": sup.cfg.argv,
        "exit_status": status,
        "attempts": attempts,
        "nodes_isolated": isolated,
        "log": str(sup.cfg.log_file),
        "blacklist": str(sup.cfg.blacklist),
        "run_dir": str(sup.cfg.run_dir),
    }


def _brief(d: dict[str, Any]) -> dict[str, Any]:
    detail = d.get("detail") or {}
    stacks = detail.get("stacks") or {}
    return {
        "level": d.get("level"),
        "kind": d.get("kind"),
        "ranks": d.get("ranks"),
        "nodes": d.get("nodes"),
        "op": d.get("op"),
        "seq": d.get("seq"),
        "localized": detail.get("localized"),
        "stacks_of_ranks": sorted(stacks, key=lambda r: int(r) if str(r).isdigit() else 0),
        "evidence_file": detail.get("evidence_file"),
    }


def render(data: dict[str, Any]) -> str:
    """The summary for a person; every string that came from a diagnosis or a command is escaped
    (``safe``): a diagnosis file or a failing command's stderr cannot write to the terminal."""
    n = len(data["attempts"])
    lines = [f"c4d run: summary ({safe(data['node'])}, {n} attempt{'s' if n != 1 else ''})"]
    for a in data["attempts"]:
        head = f"  attempt {a['attempt']}: {safe(a['ended'])}"
        if a["exit_status"] is not None:
            head += f", status {a['exit_status']}"
        head += f", {a['seconds']:.1f} s"
        if a["detail"]:
            head += f" ({safe(a['detail'])})"
        lines.append(head)
        for e in a["errors"]:
            where = ", ".join(safe(x) for x in e["nodes"] or []) or "?"
            ranks = ",".join(safe(r) for r in e["ranks"] or [])
            st = (
                f"; stacks of ranks {','.join(map(safe, e['stacks_of_ranks']))}"
                if e["stacks_of_ranks"]
                else ""
            )
            lines.append(f"    {safe(e['level'])} {safe(e['kind'])}: ranks {ranks} on {where}{st}")
        for act in a["actions"]:
            lines.append(f"    isolation {safe(act['action'])} of {safe(act['node'])}: {safe(act['status'])}"
                         + (f" ({safe(act['message'])})" if act.get("message") else ""))  # fmt: skip
        if a["isolated"]:
            lines.append(f"    isolated: {', '.join(map(safe, a['isolated']))}")
        for ev in a["evidence"]:
            lines.append(f"    evidence: {safe(ev)}")
        if a["decision"]:
            verb = "restart" if a["decision"]["restart"] else "stop"
            lines.append(f"    → {verb}: {safe(a['decision']['why'])}")
    lines.append(f"  nodes isolated: {', '.join(map(safe, data['nodes_isolated'])) or 'none'}")
    lines.append(f"  log: {safe(data['log'])}")
    lines.append(f"c4d run: exit status {data['exit_status']}")
    return "\n".join(lines)
