"""Flight Recorder columns → c4d records: the conversion step (vectorised over every rank's entries).

``convert`` runs named steps: the ranks' columns merged into one table (``_merge``); the process
groups as communicators (``_communicators``: members from pg_config or inferred, one comm id per
group); the entries as ops (``_op_rows``: collectives by collective_seq_id, coalesced groups merged;
p2p counted per peer); the ops matched across ranks (``_match``, c4d/formats/fr_match.py); the
completed ops as OP records (``_op_records``) and the state at the dump as one HEARTBEAT per rank
× communicator (``_final_beats``); then ``to_records.assemble``. The mapping's facts are in
flight_recorder's docstring."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from c4d.formats import fr_match
from c4d.formats import to_records as tr
from c4d.formats.fr_columns import DTYPES, STATES, parse_name
from c4d.formats.to_records import ImportOptions
from c4d.record import schema
from c4d.record.trace import RawTrace

Op = schema.Op
KNOWN_MAJOR = 2  # FR schema major version this reader knows ("2.x"); newer majors get a warning


def _remap(codes: np.ndarray, local: Sequence[Any], table: dict[Any, int]) -> np.ndarray:
    lut = np.array([table.setdefault(x, len(table)) for x in local], dtype=np.int32)
    return lut[codes] if len(codes) else codes


@dataclass
class _Merged:
    cols: dict[str, np.ndarray]
    pg_names: list[str]
    names: list[str]
    states: list[str]
    dtypes: list[str]
    pg_desc: dict[str, str]
    pg_config: dict[int, dict[str, list[int]]]
    versions: dict[int, str]
    lib: str
    first_record: dict[int, int]


_NUMERIC = ("cseq", "pseq", "retired", "t_created", "t_started", "t_completed", "duration_ms", "numel")


def _merge(loaded: list[tuple[int, dict[str, Any]]]) -> _Merged:
    tabs: dict[str, dict[Any, int]] = {"pg": {}, "name": {}, "state": {}, "dtype": {}}
    uni_key = {"pg": "pg_names", "name": "names", "state": "states", "dtype": "dtypes"}
    parts: dict[str, list[np.ndarray]] = {}
    pg_desc: dict[str, str] = {}
    pg_config: dict[int, dict[str, list[int]]] = {}
    versions: dict[int, str] = {}
    first_record: dict[int, int] = {}
    lib = ""
    for rank, c in loaded:
        n = c["n"]
        parts.setdefault("rank", []).append(np.full(n, rank, dtype=np.int32))
        for k, uk in uni_key.items():
            parts.setdefault(k, []).append(_remap(c[k], c[uk], tabs[k]))
        for k in _NUMERIC:
            parts.setdefault(k, []).append(c[k])
        pg_desc.update(c["pg_desc"])
        pg_config[rank] = c["pg_config"]
        versions[rank] = c["version"]
        first_record[rank] = c["first_record"]
        lib = lib or c["comm_lib_version"]
    cols = {k: np.concatenate(v) for k, v in parts.items()}

    def inv(t: dict[Any, int]) -> list[Any]:
        out: list[Any] = [None] * len(t)
        for k, i in t.items():
            out[i] = k
        return out

    return _Merged(
        cols,
        inv(tabs["pg"]),
        inv(tabs["name"]),
        inv(tabs["state"]),
        inv(tabs["dtype"]),
        pg_desc,
        pg_config,
        versions,
        lib,
        first_record,
    )


def convert(
    loaded: list[tuple[int, dict[str, Any]]],
    opts: ImportOptions,
    *,
    job: str = "",
    path: str = "",
    warnings: list[str] | None = None,
) -> RawTrace:
    """Per-rank column dicts (from ``fr_columns.columns``) → a RawTrace of c4d records.

    The ranks' columns merged; the process groups as communicators; the entries as ops; the ops
    matched across ranks (what some member never issued is not done); the completed ops as OP
    records and the state at the dump as heartbeats; then REGISTER and COMM records and the meta."""
    warns = warnings if warnings is not None else []
    m = _merge(loaded)
    dump_ranks = sorted(r for r, _ in loaded)
    nrow = len(m.cols["rank"])
    pi, pairs = _rank_groups(m)
    g = _communicators(m, pairs, dump_ranks, warns)
    ops_, nc, ranks_timed = _op_rows(m, pi, warns)
    m.cols.clear()  # the entries' columns are done with: what follows reuses their memory
    del pi
    findings = _match(ops_, nc, g, m, dump_ranks, ranks_timed, warns)
    op_recs = _op_records(ops_, g.keys)

    # -- the state at the dump
    t_end = int(max(ops_.issue.max(initial=0), ops_.start.max(initial=0), ops_.end.max(initial=0)))
    beats = _final_beats(ops_, nc, g.keys)
    regs = tr.registers(
        np.array(dump_ranks, dtype=np.int32),
        [""] * len(dump_ranks),
        g.world,
        opts,
        time_ns=int(ops_.issue.min()) if len(ops_.issue) else t_end,
        device_timing=np.isin(dump_ranks, ranks_timed).astype(np.uint8),
        nccl_version=tr.nccl_version_code(m.lib),
        job=job,
    )
    k = g.keys
    comm_recs = tr.comms(
        k.rank.astype(np.int32),
        k.comm_id,
        k.comm_rank,
        k.nranks,
        time_ns=int(regs["time_ns"][0]) if len(regs) else 0,
    )
    vers = sorted(set(m.versions.values()))
    warns.extend(_version_warnings(vers))
    meta = {
        "source_format": "fr",
        "source_path": path,
        "fr": {
            "versions": vers,
            "comm_lib_version": m.lib,
            "ranks": len(dump_ranks),
            "ranks_without_dump": g.no_dump,
            "entries": int(nrow),
            "findings": findings,
        },
        "comms": g.info,
        "import": {"warnings": warns},
    }
    return tr.assemble(
        meta,
        regs=regs,
        comm_recs=comm_recs,
        op_recs=op_recs,
        final_beats=beats,
        t_end=t_end,
        opts=opts,
        path=path,
    )


@dataclass
class _Keys:
    """Every (rank, communicator) of the job, one row each: first the ``n_used`` that entries use (in
    the order of the entries' key index, ``pi``), then the groups only a rank's pg_config names."""

    rank: np.ndarray  # int64
    comm_id: np.ndarray  # uint64
    comm_rank: np.ndarray  # int32: the rank's position among the members; -1 if it is not one
    nranks: np.ndarray  # int32
    n_used: int
    wrapped: np.ndarray  # bool: the rank's ring buffer has wrapped (its first record is not 0)


@dataclass
class _Groups:
    """The process groups as communicators: every (rank, communicator) key, what the meta says of
    each communicator (by its id in hex: name, desc, ranks), the job's size, the members without a dump."""

    keys: _Keys
    info: dict[str, dict[str, Any]]
    world: int
    no_dump: list[int]


def _rank_groups(m: _Merged) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """Each entry's (rank, process group) key as an index (``pi``), and the keys in that order as
    (rank, group name)."""
    npg = max(len(m.pg_names), 1)
    # a dump's entries come in runs of one group (a whole dump of one, with a single group)
    uniq, _, pi = schema.unique_runs(m.cols["rank"].astype(np.int64) * npg + m.cols["pg"])
    pairs = [(int(u) // npg, m.pg_names[int(u) % npg]) for u in uniq.tolist()]
    return pi, pairs


def _members(
    m: _Merged, pairs: list[tuple[int, str]], dump_ranks: list[int]
) -> dict[tuple[int, str], list[int]]:
    """Each (rank, group name)'s member ranks: the rank's pg_config, else the ranks whose entries use
    the name (the whole job for a default group), and the groups a rank's pg_config puts it in."""
    inferred: dict[str, list[int]] = {}
    for r, n in pairs:
        inferred.setdefault(n, []).append(r)
    member_sets: dict[tuple[int, str], list[int]] = {}
    # the default group spans every rank of the job: where pg_config does not list it (gloo), ranks
    # up to the highest any dump or pg_config names, so a rank that left no dump is still a member
    top = max([*dump_ranks, *(max(mem) for cfg in m.pg_config.values() for mem in cfg.values() if mem)])
    spans: dict[str, list[int]] = {}  # per default group without a pg_config entry: its members
    for r, n in pairs:
        cfg = m.pg_config.get(r, {}).get(n)
        if cfg is None and m.pg_desc.get(n) == "default_pg":
            if n not in spans:
                spans[n] = sorted(set(inferred[n]) | set(range(top + 1)))
            cfg = spans[n]
        member_sets[(r, n)] = cfg or sorted(inferred[n])
    for r in dump_ranks:  # groups a rank belongs to by its own pg_config, used or not
        for n, members in m.pg_config.get(r, {}).items():
            if r in members:
                member_sets.setdefault((r, n), members)
    return member_sets


def _communicators(
    m: _Merged, pairs: list[tuple[int, str]], dump_ranks: list[int], warns: list[str]
) -> _Groups:
    """(rank, group name) → (comm id, comm rank, nranks), one id per group and its members."""
    comm_of: dict[tuple[int, str], tuple[int, int, int]] = {}
    comm_info: dict[str, dict[str, Any]] = {}
    # each group once, however many of its members' dumps name it: (name, members) -> (comm id,
    # each member's position)
    groups: dict[tuple[str, tuple[int, ...]], tuple[int, dict[int, int]]] = {}
    for (r, n), members in _members(m, pairs, dump_ranks).items():
        g = groups.get(gk := (n, tuple(members)))
        if g is None:
            at: dict[int, int] = {}
            for i, x in enumerate(members):
                at.setdefault(x, i)
            g = groups[gk] = (tr.comm_id(f"fr:{n}:{members}"), at)
        cid, at = g
        crank = at.get(r, -1)
        if crank < 0:
            warns.append(f"rank {r} uses process group {n!r} but is not among its ranks {_short(members)}")
        comm_of[(r, n)] = (cid, crank, len(members))
        comm_info[f"{cid:016x}"] = {"name": n, "desc": m.pg_desc.get(n, ""), "ranks": members}
    listed = sorted({x for _, mem in groups for x in mem})
    no_dump = sorted(set(listed) - set(dump_ranks))
    if no_dump:
        warns.append(
            f"no dump for ranks {_short(no_dump)} (members of the process groups): "
            "c4d cannot tell whether they joined"
        )
    world = max([*listed, *dump_ranks]) + 1 if (listed or dump_ranks) else 0
    # every (rank, communicator): first the ones with entries (index = ``pi``), then pg_config-only ones
    have = set(pairs)
    keys = pairs + [k for k in comm_of if k not in have]
    k_rank = np.array([r for r, _ in keys], dtype=np.int64)
    return _Groups(
        keys=_Keys(
            rank=k_rank,
            comm_id=np.array([comm_of[k][0] for k in keys], dtype=np.uint64),
            comm_rank=np.array([comm_of[k][1] for k in keys], dtype=np.int32),
            nranks=np.array([comm_of[k][2] for k in keys], dtype=np.int32),
            n_used=len(pairs),
            # a (rank, communicator) is one key: those of a wrapped ring buffer without a collective left
            wrapped=np.array([m.first_record.get(r, 0) > 0 for r in k_rank.tolist()], dtype=bool),
        ),
        info=comm_info,
        world=world,
        no_dump=no_dump,
    )


def _match(
    ops_: _Ops,
    nc: int,
    g: _Groups,
    m: _Merged,
    dump_ranks: list[int],
    ranks_timed: np.ndarray,
    warns: list[str],
) -> list[dict[str, Any]]:
    """The collectives matched across ranks (c4d/formats/fr_match.py): ops some member never issued
    are not done, whatever their entries say (``ops_.done`` updated); disagreements, lost and late
    ranks found (returned: the meta's findings). ``ops_``'s first ``nc`` rows are collectives."""
    k = g.keys
    u_ids, k_ci = np.unique(k.comm_id, return_inverse=True)
    k_ci = k_ci.ravel()
    info = [g.info[f"{int(i):016x}"] for i in u_ids]
    has_rows = np.zeros(len(k.rank), dtype=bool)
    has_rows[ops_.pi[:nc]] = True
    no_rows = np.flatnonzero(k.wrapped & ~has_rows)
    unknown = set(zip(k.rank[no_rows].tolist(), k_ci[no_rows].tolist(), strict=True))
    matched = fr_match.check(
        comms=fr_match.Comms(u_ids, [i["name"] for i in info], [i["ranks"] for i in info]),
        cidx=k_ci[ops_.pi[:nc]],
        rank=ops_.rank[:nc],
        seq=ops_.seq[:nc],
        kind=ops_.kind[:nc],
        count=ops_.count[:nc],
        dtype=ops_.dname[:nc],
        dtype_names=m.dtypes,
        issue=ops_.issue[:nc],
        done=ops_.done[:nc],
        dump_ranks=dump_ranks,
        unknown_ranks=unknown,
        timed_ranks=set(ranks_timed.tolist()),
    )
    ops_.done[:nc] = matched.done
    # a send or recv whose peer never issued its side cannot have completed either (ranks whose ring
    # buffer wrapped are left out: their p2p counts start at the oldest entry kept)
    p_never = fr_match.p2p_unissued(
        comms=fr_match.Comms(u_ids, [i["name"] for i in info], [i["ranks"] for i in info]),
        cidx=k_ci[ops_.pi[nc:]],
        rank=ops_.rank[nc:],
        recv=ops_.kind[nc:] == Op.Recv,
        peer=ops_.peer[nc:],
        seq=ops_.seq[nc:],
        counted={r for r in dump_ranks if m.first_record.get(r, 0) == 0},
    )
    claimed = int((p_never & ops_.done[nc:]).sum())
    ops_.done[nc:] &= ~p_never
    if matched.unissued_ops or claimed:
        warns.append(
            f"{matched.unissued_ops + claimed} op(s) marked done in their dumps were never issued by some "
            "member of their group (or, for a send or recv, by its peer): taken as not completed"
        )
    return matched.findings


def _op_records(ops_: _Ops, k: _Keys) -> tr.OpColumns:
    """The completed ops as OP records, in the order the replay takes them (when each ended), so
    assemble need not reorder the records."""
    dn = np.flatnonzero(ops_.done)
    t_rec = np.maximum(np.maximum(ops_.issue[dn], ops_.start[dn]), ops_.end[dn])
    dn = dn[np.argsort(t_rec, kind="stable")]
    return tr.OpColumns(
        len(dn),
        dict(
            rank=ops_.rank,
            comm_id=k.comm_id[ops_.pi],
            seq=ops_.seq,
            issue_ns=ops_.issue,
            start_ns=ops_.start,
            end_ns=ops_.end,
            count=ops_.count,
            bytes=ops_.bytes,
            group_id=ops_.group,
            comm_rank=k.comm_rank[ops_.pi],
            comm_nranks=k.nranks[ops_.pi],
            peer=ops_.peer,
            op=ops_.kind,
            dtype=ops_.dtype,
            flags=ops_.flags,
        ),
        rows=dn,
    )


def _version_warnings(vers: list[str]) -> list[str]:
    """What the dumps' FR versions warn of: several in one job, a major newer than this reader's."""
    out = []
    if len(vers) > 1:
        out.append(f"dumps of different FR versions: {', '.join(vers)}")
    for v in vers:
        try:
            if int(v.split(".")[0]) > KNOWN_MAJOR:
                out.append(f"FR version {v} is newer than this reader knows (2.x); fields may differ")
        except ValueError:
            out.append(f"FR version {v!r} is not major.minor")
    return out


def _op_rows(m: _Merged, pi: np.ndarray, warns: list[str]) -> tuple[_Ops, int, np.ndarray]:
    """The entries (``m.cols``, one row each; ``pi``: each one's (rank, communicator) key) as ops:
    the collectives first (how many: the second value), then the p2p ops; the third value is the
    ranks whose dumps have device timing."""
    c = m.cols
    kind_of = np.array([parse_name(n)[0] for n in m.names] or [0], dtype=np.int16)
    peer_of = np.array([parse_name(n)[1] for n in m.names] or [0], dtype=np.int32)
    st = np.array([STATES.get(s, 3) for s in m.states] or [0], dtype=np.int8)[c["state"]]
    kind = kind_of[c["name"]]
    rank = c["rank"]
    dsz = np.array([DTYPES.get(d, (255, 1)) for d in m.dtypes] or [(255, 1)], dtype=np.int64)
    unknown_dt = sorted({d for d in m.dtypes if d and d not in DTYPES})
    if unknown_dt:
        warns.append(f"dtypes c4d does not know, counted as 1 byte/element: {', '.join(unknown_dt)}")
    dur_ns = np.where(np.isnan(c["duration_ms"]), -1, c["duration_ms"] * 1e6).astype(np.int64)
    done = (st == 2) | c["retired"]
    t_start = c["t_started"]
    fill = (t_start == 0) & (c["t_completed"] > 0) & (dur_ns >= 0)
    t_start[fill] = c["t_completed"][fill] - dur_ns[fill]
    # ranks (file-name numbers, >= 0) with a start time, a started entry or a duration
    ranks_timed = np.flatnonzero(np.bincount(rank[(t_start > 0) | (st == 1) | (dur_ns >= 0)]))
    timed = np.zeros(int(rank.max(initial=-1)) + 1, bool)
    timed[ranks_timed] = True
    timed = timed[rank]
    arrived = done | (st == 1) | (t_start > 0) | ~timed

    unknown = kind < 0
    if unknown.any():
        counts = np.bincount(c["name"][unknown], minlength=len(m.names))
        skipped = [
            f"{m.names[i]}×{counts[i]}"
            for i in np.flatnonzero(counts)
            if not m.names[i].endswith("coalesced")
        ]
        if skipped:
            warns.append(f"entries of kinds c4d does not map, skipped: {', '.join(skipped[:8])}")
    p2p_row = (kind == Op.Send) | (kind == Op.Recv)
    coll_row = ~unknown & ~p2p_row
    bad = coll_row & (c["cseq"] < 1)
    if bad.any():
        warns.append(f"{int(bad.sum())} collective entries with collective_seq_id < 1 skipped")
        coll_row &= ~bad

    # -- collectives: seq = collective_seq_id - 1; entries sharing one (coalesced) are one op
    ci = np.flatnonzero(coll_row)
    cseq = c["cseq"][ci] - 1
    cpi = pi[ci]
    if (order := _lexsort(cseq, cpi)) is not None:
        ci, cseq, cpi = ci[order], cseq[order], cpi[order]
    new_op = np.ones(len(ci), dtype=bool)
    new_op[1:] = (cpi[1:] != cpi[:-1]) | (cseq[1:] != cseq[:-1])
    heads = np.flatnonzero(new_op)
    nc = len(heads)

    # -- p2p: seq per (rank, comm, direction, peer) in dump order; a batch shares a p2p_seq_id
    p2 = np.flatnonzero(p2p_row)
    direction = (kind[p2] == Op.Recv).astype(np.int64)
    ppeer = peer_of[c["name"][p2]].astype(np.int64)
    order = np.lexsort((p2, ppeer, direction, pi[p2]))
    p2, direction, ppeer = p2[order], direction[order], ppeer[order]
    start_grp = np.ones(len(p2), dtype=bool)
    start_grp[1:] = (
        (pi[p2][1:] != pi[p2][:-1]) | (direction[1:] != direction[:-1]) | (ppeer[1:] != ppeer[:-1])
    )
    idx = np.arange(len(p2))
    pseq_ = idx - np.maximum.accumulate(np.where(start_grp, idx, 0)) if len(p2) else idx

    # both kinds' rows taken at once (not each apart and then joined: one copy less of every column)
    o = _Ops.take(
        np.concatenate([ci[heads], p2]),
        np.concatenate([cseq[heads], pseq_]),
        c, kind, peer_of, dsz, t_start, done, arrived, timed, pi,
    )  # fmt: skip
    if nc < len(ci):  # merge the coalesced groups
        nbytes = c["numel"][ci] * dsz[c["dtype"][ci], 1]
        o.bytes[:nc] = np.add.reduceat(nbytes, heads)
        o.count[:nc] = np.add.reduceat(c["numel"][ci], heads)
        o.issue[:nc] = np.minimum.reduceat(c["t_created"][ci], heads)
        o.start[:nc] = np.maximum.reduceat(t_start[ci], heads)
        o.end[:nc] = np.maximum.reduceat(c["t_completed"][ci], heads)
        o.done[:nc] = np.minimum.reduceat(done[ci].astype(np.int8), heads).astype(bool)
        o.arrived[:nc] = np.minimum.reduceat(arrived[ci].astype(np.int8), heads).astype(bool)
        size = np.diff(np.append(heads, len(ci)))
        o.flags[:nc] |= np.where(size > 1, int(schema.OpFlag.IN_GROUP), 0).astype(np.uint8)
        o.group[:nc] = np.where(size > 1, o.seq[:nc] + 1, 0)

    o.flags[nc:] |= np.uint8(schema.OpFlag.P2P)
    o2 = np.lexsort((c["pseq"][p2], pi[p2]))
    kk = np.stack([pi[p2][o2], c["pseq"][p2][o2]]) if len(p2) else np.zeros((2, 0), np.int64)
    same = np.zeros(len(p2), dtype=bool)
    if len(p2) > 1:
        eq = (kk[:, 1:] == kk[:, :-1]).all(axis=0)
        same[o2[1:][eq]] = True
        same[o2[:-1][eq]] = True
    o.flags[nc:] |= np.where(same, int(schema.OpFlag.IN_GROUP), 0).astype(np.uint8)
    o.group[nc:] = np.where(same, c["pseq"][p2], 0)
    o.flags |= np.where(o.start > 0, int(schema.OpFlag.DEVICE_TIMING), 0).astype(np.uint8)
    return o, nc, ranks_timed


def _lexsort(minor: np.ndarray, major: np.ndarray) -> np.ndarray | None:
    """``np.lexsort((minor, major))``, or None where the rows are in that order already (the
    dumps of one process group list its collectives in order)."""
    if len(major) < 2:
        return None
    same = major[1:] == major[:-1]
    if ((major[1:] > major[:-1]) | (same & (minor[1:] >= minor[:-1]))).all():
        return None
    return np.lexsort((minor, major))


@dataclass
class _Ops:
    """One row per op (collective or p2p) of every rank: the columns the records need."""

    pi: np.ndarray  # index of its (rank, communicator) key
    rank: np.ndarray
    seq: np.ndarray
    kind: np.ndarray
    peer: np.ndarray
    issue: np.ndarray
    start: np.ndarray
    end: np.ndarray
    done: np.ndarray
    arrived: np.ndarray
    timed: np.ndarray
    bytes: np.ndarray
    count: np.ndarray
    dtype: np.ndarray
    dname: np.ndarray  # index of the c10 dtype name (Float, Double, ...) in _Merged.dtypes
    flags: np.ndarray
    group: np.ndarray

    @classmethod
    def take(cls, rows, seq, c, kind, peer_of, dsz, t_start, done, arrived, timed, pi) -> _Ops:
        dt = c["dtype"][rows]
        return cls(
            pi=pi[rows],
            rank=c["rank"][rows],
            seq=np.asarray(seq, dtype=np.int64),
            kind=kind[rows],
            peer=peer_of[c["name"][rows]],
            issue=c["t_created"][rows],
            start=t_start[rows],
            end=c["t_completed"][rows],
            done=done[rows],
            arrived=arrived[rows],
            timed=timed[rows],
            bytes=c["numel"][rows] * dsz[dt, 1],
            count=c["numel"][rows],
            dtype=dsz[dt, 0],
            dname=dt,
            flags=np.zeros(len(rows), dtype=np.uint8),
            group=np.zeros(len(rows), dtype=np.int64),
        )


def _final_beats(o: _Ops, n_coll: int, keys: _Keys) -> np.ndarray:
    """One HEARTBEAT per rank × communicator describing the dump: counts and the oldest pending op.

    ``o``'s first ``n_coll`` rows are collectives. Ops complete in stream order, so ``n_done`` is the
    first collective not done (or all issued), likewise ``n_arrived``.
    """
    k_rank, k_id, k_crank, k_nranks = keys.rank, keys.comm_id, keys.comm_rank, keys.nranks
    n_keys, n_used, wrapped = len(keys.rank), keys.n_used, keys.wrapped
    big = np.iinfo(np.int64).max
    cpi, cseq = o.pi[:n_coll], o.seq[:n_coll]
    n_issued = np.zeros(n_keys, np.int64)
    np.maximum.at(n_issued, cpi, cseq + 1)
    first_open = np.full(n_keys, big, np.int64)
    nd = ~o.done[:n_coll]
    np.minimum.at(first_open, cpi[nd], cseq[nd])
    n_done = np.minimum(first_open, n_issued)
    first_out = np.full(n_keys, big, np.int64)
    na = ~o.arrived[:n_coll]
    np.minimum.at(first_out, cpi[na], cseq[na])
    n_arrived = np.minimum(first_out, n_issued)
    arr_t = np.where(o.start > 0, o.start, np.where(o.timed, 0, o.issue))[:n_coll]
    last_arrive = np.zeros(n_keys, np.int64)
    np.maximum.at(last_arrive, cpi, np.where(o.arrived[:n_coll], arr_t, 0))
    last_done = np.zeros(n_keys, np.int64)
    np.maximum.at(last_done, cpi, np.where(o.done[:n_coll], o.end[:n_coll], 0))
    seen = np.zeros(n_keys, bool)
    seen[cpi] = True

    pend = np.flatnonzero(~o.done)
    pend = pend[np.lexsort((o.issue[pend], o.pi[pend]))]
    _, first = np.unique(o.pi[pend], return_index=True)
    oldest = pend[first]
    has_p = np.zeros(n_keys, bool)
    has_p[o.pi[oldest]] = True
    pick = np.full(n_keys, -1, np.int64)
    pick[o.pi[oldest]] = oldest
    sel_p = np.maximum(pick, 0)

    def at(col: np.ndarray, default: int) -> np.ndarray:
        return np.where(has_p, col[sel_p] if len(col) else default, default)

    p_start = at(o.start, 0)
    p_start = np.where(p_start > 0, p_start, np.where(at(o.arrived, 0).astype(bool), at(o.issue, 0), 0))
    pend_seq = np.where(has_p, at(o.seq, 0), 0).astype(np.uint64)
    pend_seq[~has_p] = schema.UINT64_MAX
    inflight = np.bincount(o.pi[pend][o.flags[pend] & schema.OpFlag.P2P != 0], minlength=n_keys)
    # a group only in pg_config (no entries): nothing issued, unless the ring buffer has wrapped
    keep = np.flatnonzero((np.arange(n_keys) < n_used) | seen | has_p | ~wrapped)
    return tr.heartbeats(
        len(keep),
        rank=k_rank[keep].astype(np.int32),
        comm_id=k_id[keep],
        n_issued=n_issued[keep],
        n_arrived=n_arrived[keep],
        n_done=n_done[keep],
        last_arrive_ns=last_arrive[keep],
        last_done_ns=last_done[keep],
        pend_seq=pend_seq[keep],
        pend_issue_ns=at(o.issue, 0)[keep],
        pend_start_ns=p_start[keep],
        comm_rank=k_crank[keep],
        comm_nranks=k_nranks[keep],
        pend_peer=at(o.peer, -1)[keep],
        pend_op=at(o.kind, 255)[keep].astype(np.uint8),
        pend_flags=at(o.flags, 0)[keep].astype(np.uint8),
        p2p_in_flight=inflight[keep],
    )


def _short(xs: list[int], n: int = 16) -> str:
    return str(xs) if len(xs) <= n else f"{xs[:n]}… ({len(xs)} ranks)"
