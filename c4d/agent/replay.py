"""A recorded trace replayed through node agents' summarisers, as a live job with one agent per
node would feed the master; and the comparison with the direct replay.

    trace ─► per node: Edge.admit ─► Summariser.feed ─┐
                                                      ├─► master's Ingest ─► engine ─► diagnoses
    (every agent flushes at each of the trace's ticks)┘

What the agents' design must keep (c4d/agent/summary.py): the master's diagnoses. The test
(tests/test_agent_summary.py) holds every golden trace to it, diagnosis by diagnosis;
``analysis/evaluate.py --agents`` holds the random benchmark's jobs to their incidents' final
culprits (the localization model revises its verdicts as evidence comes, and an agent's
flushes change when evidence comes by up to a flush).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from c4d.agent.summary import Summariser
from c4d.intake.ingest import Ingest
from c4d.intake.validate import Edge, Limits
from c4d.offline import analyze
from c4d.record import schema, trace

_V = np.dtype((np.void, schema.RECORD_SIZE))


@dataclass
class Sent:
    """What reached the master: records (by kind) and their bytes, as the ranks sent them and
    as the agents forwarded them."""

    direct: Counter[str] = field(default_factory=Counter)
    agents: Counter[str] = field(default_factory=Counter)

    @property
    def records(self) -> tuple[int, int]:
        return sum(self.direct.values()), sum(self.agents.values())

    @property
    def bytes(self) -> tuple[int, int]:
        d, a = self.records
        return d * schema.RECORD_SIZE, a * schema.RECORD_SIZE

    def add(self, other: Sent) -> None:
        self.direct.update(other.direct)
        self.agents.update(other.agents)


def _kinds(rows: np.ndarray) -> Counter[str]:
    k, n = np.unique(rows["kind"], return_counts=True)
    return Counter({schema.Kind(int(a)).name if int(a) in schema.Kind._value2member_map_ else str(a): int(b)
                    for a, b in zip(k, n, strict=True)})  # fmt: skip


def node_of(raw: np.ndarray) -> dict[int, str]:
    """Global rank -> node name, from the trace's REGISTER records."""
    reg = raw[raw["kind"] == schema.Kind.REGISTER].view(schema.REGISTER)
    return {int(r["rank"]): r["node"].split(b"\0")[0].decode() for r in reg}


def direct(rt: trace.RawTrace) -> list:
    """The trace replayed straight into the engine (what the agents are compared with)."""
    return list(analyze.replay(rt, analyze.make_engine()))


def through_agents(
    rt: trace.RawTrace, engine: Any = None, **summariser: Any
) -> tuple[list, dict[str, Summariser], Ingest, Sent]:
    """The trace's records, each node's through its own edge and summariser, then the master's
    ingest (into ``engine``, default a new one); every agent flushes at each tick, before the
    master evaluates. ``summariser``: the summarisers' options."""
    raw = rt.raw
    nodes_of = node_of(raw)
    nodes = sorted(set(nodes_of.values())) or ["-"]
    row_node = np.array([nodes.index(nodes_of.get(int(g), nodes[0])) for g in raw["rank"]], np.int64)
    agents = {n: (Edge(Limits.from_env()), Summariser(**summariser)) for n in nodes}
    master = Ingest(engine if engine is not None else analyze.make_engine(), Edge(Limits.from_env()))
    sent = Sent()
    out: list = []
    ticks = np.flatnonzero(raw["kind"] == schema.Kind.TICK).tolist()
    last_tick = int(rt.meta.get("created_ns", 0))
    prev = 0
    for i in [*ticks, len(raw)]:
        seg, seg_node = raw[prev:i], row_node[prev:i]
        sent.direct.update(_kinds(seg))
        fwd = []
        for k, n in enumerate(nodes):
            edge, summ = agents[n]
            rows = edge.admit(seg[seg_node == k], last_tick)
            if len(rows):
                fwd.append(summ.feed(rows))
        fwd = [f for f in fwd if len(f)]
        if fwd:
            batch = np.concatenate([f.view(_V) for f in fwd]).view(schema.HEADER)
            sent.agents.update(_kinds(batch))
            master.feed(batch, last_tick)
        if i < len(raw):
            last_tick = int(raw["time_ns"][i])
            out.extend(master.tick(last_tick))
        prev = i + 1
    out.extend(master.settle())  # (an engine process's answers come a tick late)
    return out, {n: s for n, (_, s) in agents.items()}, master, sent


def final_culprits(diagnoses: list) -> list[tuple]:
    """Per incident (c4d.engine.incidents folds the stream of Diagnosis objects), what it ended up
    naming: kind, level, culprit ranks and nodes; sorted."""
    from c4d.engine.incidents import Incidents

    out = []
    for inc in Incidents.fold(diagnoses):
        d = inc.current or inc.first
        out.append((inc.kind, inc.level.name, tuple(d.ranks), tuple(d.nodes)))
    return sorted(out)


def compare(path) -> dict:
    """A trace replayed directly and through one node agent per node: its incidents' final
    culprits both ways (``same``: they agree), and the records each way sent (``sent``; and
    ``unpaired``: what the agents send without OPPART parts, for the comparison)."""
    rt = trace.read_raw(path)
    direct_ = final_culprits(direct(rt))
    via, _summ, _master, sent = through_agents(rt)
    agents = final_culprits(via)
    unpaired = through_agents(rt, parts=False)[3]
    return {"same": direct_ == agents, "direct": direct_, "agents": agents, "sent": sent,
            "unpaired": unpaired}  # fmt: skip


def job_line(a: dict) -> str:
    d, v = a["sent"].records
    u = a["unpaired"].records[1]
    line = (f"    agents: final culprits {'same' if a['same'] else 'DIFFER'}; records to the master {v:,} "
            f"of {d:,} ({v / max(d, 1):.0%}; {u:,} without parts)")  # fmt: skip
    if not a["same"]:
        line += f"\n    direct {a['direct']}\n    agents {a['agents']}"
    return line


def summary_line(comparisons: list[dict]) -> str:
    tot, unpaired = Sent(), Sent()
    for a in comparisons:
        tot.add(a["sent"])
        unpaired.add(a["unpaired"])
    same = sum(a["same"] for a in comparisons)
    (d, v), (db, vb) = tot.records, tot.bytes
    kinds = ", ".join(
        f"{k} {tot.direct[k]:,} -> {tot.agents[k]:,}" for k in sorted(set(tot.direct) | set(tot.agents))
    )
    u = unpaired.records[1]
    return (f"agents vs direct: {same}/{len(comparisons)} jobs with the same final culprits; records to "
            f"the master {v:,} of {d:,} ({v / max(d, 1):.1%}; {u:,} without OPPART parts), bytes {vb:,} "
            f"of {db:,}; by kind (direct -> agents): {kinds}")  # fmt: skip
