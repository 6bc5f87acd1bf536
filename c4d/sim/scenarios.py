"""Fault scenarios: run `c4d sim` with injected faults and say what a right diagnosis is.

Shared by tests/test_scenarios.py (a CI-sized matrix and the issue-9 cases) and
analysis/evaluate.py (the full matrix, and the randomized benchmark: ``random_jobs``). Each
scenario is a real simulated job: processes, shim, simnccl, ZeroMQ, master, engine; the
randomized ones also load the machine's CPU with busy processes while they run.

Fault onset (for detection latency) is the start of step S on the faulty rank, read from
the trace: the end of that rank's last op of step S-1 (the driver synchronises its stream
after its ops of a step, then starts the next).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from c4d.engine.blame import Hyp
from c4d.record import schema, trace
from c4d.sim import faults
from c4d.sim.sim import QUICK_ENV

EXPECTED_KIND = {
    "noncomm-hang": "RankNonCommHang",
    "comm-hang": "RankCommHang",
    "noncomm-slow": "RankNonCommSlow",
    "comm-slow": "RankCommSlow",
    "crash": "RankLost",
    "mismatch": "CollectiveMismatch",
}
HANG_KINDS = {"RankNonCommHang", "RankCommHang", "RankLost", "CollectiveMismatch"}
ISOLATING_KINDS = HANG_KINDS - {"CollectiveMismatch"}  # a program bug takes no node out
SLOW_STEPS = 250  # enough for the onset window and two more at the slowed pace

# `c4d sim --quick`'s thresholds and link speeds, so a matrix runs in minutes (c4d.sim.sim.QUICK_ENV
# says why: T = 1 s, ERROR after 3 x T, 1 s slow windows, heartbeats at T/5, links slow enough
# that a factor F slowdown reads as roughly F on a small machine).
SCENARIO_ENV = QUICK_ENV


@dataclass(frozen=True)
class Expect:
    """What a right diagnosis of one injected fault is."""

    spec: str
    fault: faults.Fault
    kind: str  # the DiagKind value
    ranks: frozenset[int]  # exactly these culprits (a link: both ends; a mismatch: its cycle)
    is_link: bool

    def matches(self, d: dict) -> bool:
        """The diagnosis is about this fault: its kind, and a culprit among the fault's ranks."""
        return d["kind"] == self.kind and bool(self.ranks & set(d["ranks"]))

    def exact(self, d: dict) -> bool:
        """It names exactly the culprit: the rank(s), the link, the node's ranks, or the cycle."""
        if not self.matches(d) or set(d["ranks"]) != self.ranks:
            return False
        target = (d.get("localization") or {}).get("target")
        if target is None:  # a diagnosis from before typed localizations
            return True
        if self.fault.node is not None:
            return target in ("node", "rank")
        return target == (
            "link" if self.is_link else "cycle" if self.kind == "CollectiveMismatch" else "rank"
        )

    def among_equivalents(self, d: dict) -> bool:
        """It names the culprit, or lists it among what nothing observable tells from the one it
        names (its basis ends in ``/equivalent``: a hung rank whose first stuck op is a two-rank
        unit looks the same as that unit's link until the job ends)."""
        if self.exact(d):
            return True
        loc = d.get("localization") or {}
        equivalent = str(loc.get("basis", "")).endswith("/equivalent")
        if not self.matches(d) or not equivalent or self.fault.node is not None:
            return False
        ends = sorted(self.ranks)
        if len(ends) != (2 if self.is_link else 1):
            return False
        h = Hyp(link=(ends[0], ends[1])) if self.is_link else Hyp(rank=ends[0])
        return h.name() in loc.get("alternatives", ())

    def on_its_node(self, d: dict, rpn: int) -> bool:
        """It names the node the culprit (a rank, or a link inside one node) is on: exact where
        nothing visible tells the ranks of that node apart. A node's fault named by some of its
        ranks (the others wait behind them, e.g. in a pipeline) is on its node too."""
        if not self.matches(d):
            return False
        target = (d.get("localization") or {}).get("target")
        if self.fault.node is not None:
            return target in ("rank", "node") and set(d["ranks"]) <= self.ranks
        if target != "node":
            return False
        nodes = {r // rpn for r in self.ranks}
        return len(nodes) == 1 and {r // rpn for r in d["ranks"]} == nodes


@dataclass(frozen=True)
class Scenario:
    ranks: int
    ranks_per_node: int
    tp: int
    pp: int
    fault: str | None  # None: a clean run
    steps: int = 400
    clock_skew: float = 0.0
    more: tuple[str, ...] = ()  # further faults in the same job
    cpu_load: int = 0  # busy processes beside the job (the machine's load as a factor)
    seed: int = 0

    @property
    def specs(self) -> tuple[str, ...]:
        return ((self.fault,) if self.fault else ()) + self.more

    @property
    def name(self) -> str:
        shape = f"{self.ranks}r{-(-self.ranks // self.ranks_per_node)}n-tp{self.tp}pp{self.pp}"
        skew = f"-skew{self.clock_skew:g}" if self.clock_skew else ""
        load = f"-load{self.cpu_load}" if self.cpu_load else ""
        return f"{shape}{skew}{load}:{'+'.join(self.specs) or 'clean'}"

    @property
    def nodes(self) -> int:
        return -(-self.ranks // self.ranks_per_node)

    @property
    def layout(self) -> list[str]:
        return faults.block_layout(self.ranks, self.ranks_per_node)

    def parsed(self) -> faults.Fault | None:
        return faults.parse(self.fault, world=self.ranks, nodes=self.nodes) if self.fault else None

    def expect(self, spec: str) -> Expect:
        f = faults.parse(spec, world=self.ranks, nodes=self.nodes)
        if f.kind == "mismatch" and f.rank is not None:
            # the rank that left out its op and the ranks of that op's group waiting in it: its
            # TP group, or with tp = 1 its DP group (the ranks of its pipeline stage)
            if self.tp > 1:
                first = f.rank - f.rank % self.tp
                ranks = set(range(first, first + self.tp))
            else:
                dp = self.ranks // self.pp
                first = f.rank - f.rank % dp
                ranks = set(range(first, first + dp))
        else:
            ranks = set(f.ranks(self.layout))
        return Expect(spec, f, EXPECTED_KIND[f.kind], frozenset(ranks), f.link is not None)

    @property
    def expected_kind(self) -> str | None:
        return self.expect(self.fault).kind if self.fault else None

    @property
    def expected_ranks(self) -> set[int]:
        return set(self.expect(self.fault).ranks) if self.fault else set()

    @property
    def expected_nodes(self) -> set[str]:
        return {f"node-{r // self.ranks_per_node}" for r in self.expected_ranks}


@dataclass
class Outcome:
    scenario: Scenario
    status: int
    diagnoses: list[dict]
    blacklist: list[str]
    onset_s: float | None
    seconds: float
    stderr: str = ""
    trace_path: str = ""
    kinds_seen: set[str] = field(default_factory=set)
    onsets: dict[str, float | None] = field(default_factory=dict)  # per fault spec
    end_s: float | None = None  # the last op the trace saw end (master clock, s)
    slowdowns: dict[str, float | None] = field(default_factory=dict)  # comm-slow: measured_slowdown

    def of_kind(self, kind: str, levels=("WARNING", "ERROR", "INFO")) -> list[dict]:
        return [d for d in self.diagnoses if d["kind"] == kind and d["level"] in levels]

    @property
    def correct(self) -> list[dict]:
        """Diagnoses of the injected kind whose culprits are exactly the injected ranks."""
        sc = self.scenario
        if sc.expected_kind is None:
            return []
        return [d for d in self.of_kind(sc.expected_kind) if set(d["ranks"]) == sc.expected_ranks]

    @property
    def wrong(self) -> list[dict]:
        """Every other diagnosis (wrong kind, or the right kind naming the wrong ranks)."""
        ok = {id(d) for d in self.correct}
        return [d for d in self.diagnoses if id(d) not in ok]

    def latency(self, level: str) -> float | None:
        hits = [d["time"] for d in self.correct if d["level"] == level]
        if not hits or self.onset_s is None:
            return None
        return min(hits) - self.onset_s


def node_offsets_s(sc: Scenario) -> list[float]:
    """The clock offset `c4d sim --clock-skew --seed` gives each node (c4d.sim.sim.SimJob)."""
    rng = random.Random(sc.seed)
    return [0.0] + [int(rng.uniform(-sc.clock_skew, sc.clock_skew) * 1e9) / 1e9 for _ in range(sc.nodes - 1)]


def _step_start(ops: np.ndarray, rank: int, step: int) -> float | None:
    """When ``rank`` started ``step`` (rank clock, s): the end of its step-1 DP all-reduce (the
    driver calls one a step, then synchronises); None when the trace has no such op."""
    mine = ops[(ops["rank"] == rank) & (ops["op"] == schema.Op.AllReduce)]
    if step == 0:
        m = ops[ops["rank"] == rank]
        return float(m["issue_ns"].min()) / 1e9 if len(m) else None
    mine = mine[np.argsort(mine["issue_ns"], kind="stable")]
    return float(mine["end_ns"][step - 1]) / 1e9 if len(mine) >= step else None


def _onsets(tr: trace.RawTrace, sc: Scenario) -> dict[str, float | None]:
    """Per fault: the start of its step on its (first) rank, on the master's clock; None when
    the job never got there. A crashed rank's last records die with it: then the median over
    the ranks that did start that step."""
    ops = tr.kinds[schema.Kind.OP]
    skew = node_offsets_s(sc)
    rpn = sc.ranks_per_node
    out: dict[str, float | None] = {}
    for spec in sc.specs:
        f = sc.expect(spec).fault
        r = min(f.ranks(sc.layout)) if f.kind != "mismatch" else int(f.rank or 0)
        t = _step_start(ops, r, f.step)
        if t is not None:
            out[spec] = t - skew[r // rpn]
            continue
        others = [
            x - skew[g // rpn] for g in range(sc.ranks) if (x := _step_start(ops, g, f.step)) is not None
        ]
        out[spec] = float(np.median(others)) if others and f.kind == "crash" else None
    return out


def measured_slowdown(tr: trace.RawTrace, sc: Scenario, spec: str, onset: float | None) -> float | None:
    """How much a comm-slow fault slowed the communicators it touches, read off the trace (not
    the engine): per collective, the shortest member's op (the last to arrive waits for no
    one: its op is the transfer), median after the onset over median before; the largest over
    the communicators holding the fault's ranks. This is the slowdown the job had, simnccl's
    own host work included, which the model (slow_effect) leaves out; the engine's line
    (C4D_SLOW_BW_RATIO 0.5) is 2. None when the trace has too few ops either side."""
    f = sc.expect(spec).fault
    if f.kind != "comm-slow" or f.until is not None or onset is None:  # not a transient one
        return None
    ops = tr.kinds[schema.Kind.OP]
    ops = ops[(ops["flags"] & schema.OpFlag.P2P) == 0]
    if not len(ops):
        return None
    skew = np.asarray(node_offsets_s(sc))
    rank = ops["rank"].astype(np.int64)
    start = ops["start_ns"] / 1e9 - skew[np.minimum(rank // sc.ranks_per_node, len(skew) - 1)]
    dur = (ops["end_ns"].astype(np.int64) - ops["start_ns"].astype(np.int64)) / 1e9
    want = set(f.ranks(sc.layout))
    best: float | None = None
    for cid in np.unique(ops["comm_id"]).tolist():
        m = ops["comm_id"] == cid
        members = set(np.unique(rank[m]).tolist())
        if not want <= members or len(members) < 2:  # a one-rank communicator waits for no link
            continue
        seq, d, t = ops["seq"][m], dur[m], start[m]
        order = np.lexsort((d, seq))
        seq, d, t = seq[order], d[order], t[order]
        head = np.r_[True, seq[1:] != seq[:-1]]  # per collective: its shortest member op
        d, t = d[head], t[head]
        before, after = d[t < onset - 0.05], d[t > onset + 0.2]
        if len(before) < 8 or len(after) < 8:
            continue
        r = float(np.median(after) / np.median(before))
        best = r if best is None else max(best, r)
    return best


class CpuLoad:
    """``n`` busy processes for as long as the context lasts: a loaded machine."""

    def __init__(self, n: int):
        self.n = n
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> CpuLoad:
        for _ in range(self.n):
            self.procs.append(
                subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
            )
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


def run(sc: Scenario, workdir: Path | None = None, timeout: float = 300) -> Outcome:
    """Run one scenario as `c4d sim --json` in a subprocess and collect what it said."""
    wd = Path(workdir or tempfile.mkdtemp(prefix="c4d-scn-"))
    tpath, bl = wd / "trace.c4d", wd / "blacklist.txt"
    args = [sys.executable, "-m", "c4d", "sim", "--ranks", str(sc.ranks), "--ranks-per-node",
            str(sc.ranks_per_node), "--tp", str(sc.tp), "--pp", str(sc.pp), "--steps", str(sc.steps),
            "--json", "--trace", str(tpath), "--blacklist", str(bl), "--max-seconds", "120",
            "--seed", str(sc.seed)]  # fmt: skip
    for spec in sc.specs:
        args += ["--fault", spec]
    if sc.clock_skew:
        args += ["--clock-skew", str(sc.clock_skew)]
    env = {**os.environ, **SCENARIO_ENV}
    with CpuLoad(sc.cpu_load):
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    diags = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    m = re.search(r"^c4d sim: .* \(([0-9.]+) s\)$", p.stderr, re.M)
    seconds = float(m.group(1)) if m else 0.0
    onsets: dict[str, float | None] = dict.fromkeys(sc.specs)
    slowdowns: dict[str, float | None] = dict.fromkeys(sc.specs)
    end = None
    if tpath.exists():
        tr = trace.read_raw(tpath)
        onsets = _onsets(tr, sc)
        slowdowns = {spec: measured_slowdown(tr, sc, spec, onsets.get(spec)) for spec in sc.specs}
        ends = tr.kinds[schema.Kind.OP]["end_ns"]
        end = float(ends.max()) / 1e9 if len(ends) else None
    first = onsets.get(sc.fault) if sc.fault else None
    return Outcome(
        scenario=sc,
        status=p.returncode,
        diagnoses=diags,
        blacklist=bl.read_text().split() if bl.exists() else [],
        onset_s=first,
        seconds=seconds,
        stderr=p.stderr,
        trace_path=str(tpath),
        kinds_seen={d["kind"] for d in diags},
        onsets=onsets,
        end_s=end,
        slowdowns=slowdowns,
    )


def issue9_cases() -> list[Scenario]:
    """The cases issue 9 was filed with, and the rank-vs-link cases it asks for.

    * a slow rank in pure data parallel (tp = pp = 1): no diagnosis at all before (its compute
      gap was measured from its one-rank TP group's op, which waits for nobody);
    * rank vs link in rings of 4 and 8 whose links all cross nodes (one rank per node), where
      per-peer progress sees both links of a rank: a rank's fault stalls or slows both of its
      links (two links show it: the rank), a link's fault one (the link);
    * the issue's rank-7 case: its slow DP ring is paced by its link to rank 1, its two-rank TP
      communicator is slowed too — two of its links, so the rank;
    * a rank that leaves out a collective: a wait cycle with its TP peer (CollectiveMismatch);
    * slow ranks in tensor-parallel-only and pipeline-only shapes (dp = 1): a slow compute in
      one TP group of 8; a slow rank in a TP ring of 4 across nodes; a slow middle stage of a
      4-stage pipeline (only p2p transfers: its two links are slow, the third is not),
      one slow link between two stages, and a slow-computing stage (no collective compares
      it with another rank: its compute against its own earlier windows, own_pace.py).
    """
    out = [
        Scenario(8, 2, 1, 1, "noncomm-slow@rank=6,step=20,factor=3", steps=SLOW_STEPS),
        Scenario(16, 4, 1, 1, "noncomm-slow@rank=9,step=20,factor=2", steps=SLOW_STEPS),
        Scenario(8, 4, 2, 1, "comm-slow@rank=7,step=20,factor=5", steps=SLOW_STEPS),
        Scenario(8, 4, 2, 1, "mismatch@rank=5,step=20"),
        Scenario(8, 8, 8, 1, "noncomm-slow@rank=5,step=20,factor=3", steps=SLOW_STEPS),
        Scenario(4, 1, 4, 1, "comm-slow@rank=2,step=120,factor=4", steps=SLOW_STEPS + 100),
        Scenario(4, 1, 1, 4, "comm-slow@rank=2,step=120,factor=4", steps=SLOW_STEPS + 100),
        Scenario(4, 1, 1, 4, "comm-slow@link=1-2,step=120,factor=4", steps=SLOW_STEPS + 100),
        Scenario(4, 1, 1, 4, "noncomm-slow@rank=1,step=120,factor=3", steps=SLOW_STEPS + 100),
    ]
    for ranks in (4, 8):
        r, a = ranks // 2, ranks // 2 - 1
        out += [
            Scenario(ranks, 1, 1, 1, f"comm-hang@rank={r},step=20"),
            Scenario(ranks, 1, 1, 1, f"comm-hang@link={a}-{r},step=20"),
            # one communicator: its own earlier windows are the reference, so the fault starts
            # after a few clean ones
            Scenario(ranks, 1, 1, 1, f"comm-slow@rank={r},step=120,factor=4", steps=SLOW_STEPS + 100),
            Scenario(ranks, 1, 1, 1, f"comm-slow@link={a}-{r},step=120,factor=4", steps=SLOW_STEPS + 100),
        ]
    return out


def matrix(full: bool = False) -> list[Scenario]:
    """Every fault kind at the first, a middle and the last rank, across node boundaries, in
    several shapes; plus clean runs with and without clock skew. ``full=False`` is the CI subset.

    comm-hang at a rank runs in shapes whose first op after the onset is a ring of four: in
    the tp=2 shapes every rank's first op is a two-rank all-gather or a pipeline p2p, i.e.
    one link, and a rank whose transfers all stopped is then indistinguishable from that
    link (nothing else of it is in flight). There the engine names the link, honestly, and
    a scenario expecting the rank could only pass by guessing; see docs/engine.md. That ring
    runs over the network (one rank per node): NCCL reports per-peer progress (profiler
    ProxyOps) for network transfers only, none for NVLink/P2P/SHM inside a node
    (docs/real-nccl.md), so a ring inside one node gives the engine nothing to localize with.
    """
    out: list[Scenario] = []
    shapes = [(8, 4, 2, 2), (16, 4, 2, 2)] + ([(16, 8, 2, 1), (32, 8, 2, 2)] if full else [])
    for ranks, rpn, tp, pp in shapes:
        first, mid, last = 0, ranks // 2 + 1, ranks - 1
        for kind, extra, steps in (("noncomm-hang", "", 400), ("crash", "", 400),
                                   ("noncomm-slow", ",factor=4", SLOW_STEPS),
                                   ("comm-slow", ",factor=4", SLOW_STEPS)):  # fmt: skip
            positions = (first, mid, last) if (full or ranks == 8) else (mid,)
            for r in positions:
                out.append(Scenario(ranks, rpn, tp, pp, f"{kind}@rank={r},step=20{extra}", steps=steps))
        # a link across a node boundary: pipeline neighbours (same PP group, adjacent stages),
        # or without a pipeline, neighbours in a data-parallel ring
        a = rpn - 1
        b = a + (ranks // pp if pp > 1 else tp)
        out.append(Scenario(ranks, rpn, tp, pp, f"comm-hang@link={a}-{b},step=20"))
        if full:
            slow_link = f"comm-slow@link={a}-{b},step=20,factor=4"
            out.append(Scenario(ranks, rpn, tp, pp, slow_link, steps=SLOW_STEPS))
            out.append(Scenario(ranks, rpn, tp, pp, "noncomm-hang@node=node-1,step=20"))
    for ranks, rpn, tp, pp in [(8, 1, 4, 1)] + ([(16, 1, 4, 1)] if full else []):
        for r in (0, ranks // 2 + 1, ranks - 1):
            out.append(Scenario(ranks, rpn, tp, pp, f"comm-hang@rank={r},step=20"))
    out.append(Scenario(16, 4, 2, 2, None, steps=300))
    out.append(Scenario(16, 4, 2, 2, None, steps=300, clock_skew=0.05))
    if not full:  # the largest shape, once in CI (the full matrix runs it for every kind)
        out.append(Scenario(32, 8, 2, 2, "noncomm-hang@rank=17,step=20"))
    if full:
        out.append(Scenario(32, 8, 2, 2, None, steps=300, clock_skew=0.05))
        out.append(Scenario(16, 4, 2, 2, "noncomm-hang@rank=9,step=20", clock_skew=0.05))
        slow9 = "noncomm-slow@rank=9,step=20,factor=4"
        out.append(Scenario(16, 4, 2, 2, slow9, steps=SLOW_STEPS, clock_skew=0.05))
    return out


# -- the randomized benchmark ---------------------------------------------------------------
KIND_WEIGHTS = {
    "noncomm-hang": 18,
    "comm-hang": 18,
    "noncomm-slow": 20,
    "comm-slow": 22,
    "crash": 10,
    "mismatch": 8,
}
RANK_WEIGHTS = {8: 4, 12: 1, 16: 4, 24: 2, 32: 2, 48: 1, 64: 1}


def _links(ranks: int, tp: int, pp: int) -> list[tuple[int, int]]:
    """The links the job's communicators use (simtrain's Megatron layout; rings over comm ranks)."""
    dp = ranks // (tp * pp)
    out = set()
    for r in range(ranks):
        t, d, p = r % tp, (r // tp) % dp, r // (tp * dp)
        if tp > 1:
            out.add(tuple(sorted((r, p * dp * tp + d * tp + (t + 1) % tp))))
        if dp > 1:
            out.add(tuple(sorted((r, p * dp * tp + ((d + 1) % dp) * tp + t))))
        if p + 1 < pp:
            out.add((r, r + dp * tp))
    return sorted(out)  # type: ignore[arg-type]


def _comm_groups(ranks: int, tp: int, pp: int) -> list[list[int]]:
    """Each communicator's members in ring order (simtrain's layout): TP groups, DP groups and
    the pipeline pairs of adjacent stages."""
    dp = ranks // (tp * pp)
    out = []
    for p in range(pp):
        for d in range(dp):
            out.append([p * dp * tp + d * tp + t for t in range(tp)])
        for t in range(tp):
            out.append([p * dp * tp + d * tp + t for d in range(dp)])
    for r in range(ranks - dp * tp):
        out.append([r, r + dp * tp])
    return [g for g in out if len(g) > 1]


def slow_effect(sc: Scenario, spec: str) -> float:
    """How much a comm fault slows the most affected communicator of the simulated job: its
    slowest link before / after (simnccl's links: SCENARIO_ENV's bandwidths, a ring over its
    members in order, two-rank groups both ways). A link inside a node slowed less than the
    network links of its ring stays hidden (effect 1), and so does a direction (dir=) no
    communicator uses, even hung; a used hung link is infinitely slow."""
    f = sc.expect(spec).fault
    if f.kind not in ("comm-slow", "comm-hang"):
        return math.inf
    factor = f.factor if f.kind == "comm-slow" and f.factor else math.inf  # a hung link: infinitely slow
    intra, inter = float(SCENARIO_ENV["SIMNCCL_INTRA_GBPS"]), float(SCENARIO_ENV["SIMNCCL_INTER_GBPS"])
    node = [r // sc.ranks_per_node for r in range(sc.ranks)]

    def hit(a: int, b: int) -> bool:
        if f.link is None:
            return f.rank in (a, b)
        x, y = f.link
        return ((a, b) == (x, y) and f.dir != "rev") or ((a, b) == (y, x) and f.dir != "fwd")

    best = 1.0
    for g in _comm_groups(sc.ranks, sc.tp, sc.pp):
        n = len(g)
        edges = [(g[0], g[1]), (g[1], g[0])] if n == 2 else [(g[i], g[(i + 1) % n]) for i in range(n)]
        base = [intra if node[a] == node[b] else inter for a, b in edges]
        after = [bw / factor if hit(a, b) else bw for (a, b), bw in zip(edges, base, strict=True)]
        best = max(best, min(base) / min(after) if min(after) > 0 else math.inf)
    return best


def _fault(
    rng: random.Random, kind: str, ranks: int, rpn: int, tp: int, pp: int, step: int, taken: set[int]
) -> str:
    nodes = -(-ranks // rpn)
    free = [r for r in range(ranks) if r not in taken] or list(range(ranks))
    where = f"rank={rng.choice(free)}"
    comm = kind in ("comm-hang", "comm-slow")
    node = rng.randrange(nodes)
    whole_node = nodes > 1 and not any(r // rpn == node for r in taken)
    if comm and rng.random() < 0.35:
        links = [lk for lk in _links(ranks, tp, pp) if not set(lk) & taken] or _links(ranks, tp, pp)
        a, b = rng.choice(links)
        where = f"link={a}-{b}" + (f",dir={rng.choice(('fwd', 'rev'))}" if rng.random() < 0.25 else "")
    elif comm and whole_node and rng.random() < 0.15:
        where = f"node=node-{node}"  # its host, NIC or switch port: every link of its ranks
    elif kind in ("noncomm-hang", "crash") and rng.random() < 0.15 and whole_node:
        where = f"node=node-{node}"
    spec = f"{kind}@{where},step={step}"
    if kind in ("noncomm-slow", "comm-slow"):
        spec += f",factor={math.exp(rng.uniform(math.log(1.5), math.log(10))):.2f}"
        if rng.random() < 0.2:
            spec += f",until={step + rng.randint(3, 30)}"  # recovers
    elif kind == "noncomm-hang" and rng.random() < 0.2:
        spec += f",secs={rng.uniform(0.3, 2.5):.2f}"  # a compute stall that ends
    return spec


def random_jobs(n: int, seed: int, max_ranks: int = 64) -> list[Scenario]:
    """``n`` jobs drawn from ``seed``: shape (8 to ``max_ranks`` ranks; tp 1, 2, 4 or 8; 1 to 4
    pipeline stages; 1 to 8 ranks per node, tensor-parallel groups inside a node in most jobs),
    none (a clean job, 12 %), one or two faults of any kind at any rank, link (one direction in
    a quarter of them) or node (comm faults too), from step 0 in a fifth of the jobs, factor
    1.5–10 (log-uniform), transient faults that recover (20 % of the slow and compute-hang
    faults), clock skew up to ±0.1 s (half the jobs) and zero to two busy processes loading the
    machine."""
    rng = random.Random(seed)
    sizes = [r for r in RANK_WEIGHTS if r <= max_ranks]
    out = []
    for i in range(n):
        ranks = rng.choices(sizes, [RANK_WEIGHTS[r] for r in sizes])[0]
        shapes = [
            (tp, pp)
            for tp in (1, 2, 4, 8)
            for pp in (1, 2, 3, 4)
            if ranks % (tp * pp) == 0 and ranks // (tp * pp) >= 2
        ]
        tp, pp = rng.choice(shapes)
        per_node = [x for x in (1, 2, 3, 4, 6, 8) if x < ranks and ranks % x == 0]
        inside = [x for x in per_node if x % tp == 0]
        rpn = rng.choice(inside if inside and rng.random() < 0.75 else per_node)
        post = max(60, 2400 // ranks)  # steps after the onset: a few check periods at any size
        onset = 0 if rng.random() < 0.2 else rng.randint(25, 60)
        specs: list[str] = []
        if rng.random() >= 0.12:
            kinds = list(KIND_WEIGHTS)
            taken: set[int] = set()
            for _ in range(2 if rng.random() < 0.2 else 1):
                kind = rng.choices(kinds, [KIND_WEIGHTS[k] for k in kinds])[0]
                if kind == "mismatch" and any(x.startswith("mismatch") for x in specs):
                    kind = "noncomm-slow"  # one program bug a job: the first one deadlocks it
                step = onset + (rng.randint(0, 15) if specs else 0)
                spec = _fault(rng, kind, ranks, rpn, tp, pp, step, taken)
                specs.append(spec)
                sc0 = Scenario(ranks, rpn, tp, pp, spec)
                taken |= set(sc0.expected_ranks)
        skew = round(rng.uniform(0.005, 0.1), 3) if rng.random() < 0.5 else 0.0
        load = rng.choices([0, 1, 2], [5, 3, 2])[0]
        out.append(
            Scenario(ranks, rpn, tp, pp, specs[0] if specs else None, steps=onset + post, clock_skew=skew,
                     more=tuple(specs[1:]), cpu_load=load, seed=seed * 1000 + i)
        )  # fmt: skip
    return out
