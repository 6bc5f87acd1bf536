"""What the wait-for graph reads of a communicator, as a snapshot: ``WaitView``.

The hang judge (hang.py) runs where every communicator's evidence is joined; the
communicators' state (``Comm``, the ``Pool``) may live elsewhere (docs/engine-shards.md, "The
design"). So the graph takes plain copies built on the communicators' side, one per
communicator someone waits in (``busy_views``): ints, numpy arrays and one dict, picklable,
unchanged by anything fed after they were taken.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from c4d.engine.rows import P2P, cat
from c4d.record import schema

if TYPE_CHECKING:
    from c4d.engine.comm import Comm
    from c4d.engine.pool import Pool


@dataclass(slots=True, eq=False)
class WaitView:
    """A communicator's members' latest heartbeats and what the graph needs besides, copied;
    the attribute and method names are ``Comm``'s, so hang.py reads either alike."""

    idx: int  # the engine's communicator index
    id: int  # the communicator's id (diagnoses name it)
    n: int  # members
    W: int  # the op ring's slots
    grank: np.ndarray
    gone: np.ndarray
    hb_seen: np.ndarray
    hb_time: np.ndarray  # rank clock
    n_issued: np.ndarray
    n_arrived: np.ndarray
    done: np.ndarray  # Comm.done_eff(): highest op finished per member, heartbeats or records
    last_arrive: np.ndarray
    pend_seq: np.ndarray
    pend_op: np.ndarray
    pend_peer: np.ndarray
    pend_flags: np.ndarray
    pend_issue: np.ndarray
    pend_start: np.ndarray
    p2p_in_flight: np.ndarray
    tag: np.ndarray  # the op ring's seq and op code per slot (hang._op_of)
    opk: np.ndarray
    p2p_done: dict[tuple[int, int, int], int]  # (comm rank, op, peer) -> seq + 1
    # PEER rows of the collectives that may be stuck (every member arrived, none finished:
    # the only ops hang_links reads), in the order the communicator keeps them
    peer: np.ndarray

    def done_eff(self) -> np.ndarray:
        return self.done

    def members(self) -> np.ndarray:
        return np.flatnonzero(~self.gone)

    def peer_table(self) -> np.ndarray:
        return self.peer

    @classmethod
    def of(cls, c: Comm, done: np.ndarray | None = None) -> WaitView:
        """A copy of what the graph reads of ``c`` now (``done``: ``c.done_eff()``, a fresh array
        the caller computed already)."""
        done = c.done_eff() if done is None else done
        return cls(
            idx=c.idx, id=c.id, n=c.n, W=c.W,
            grank=c.grank.copy(), gone=c.gone.copy(), hb_seen=c.hb_seen.copy(), hb_time=c.hb_time.copy(),
            n_issued=c.n_issued.copy(), n_arrived=c.n_arrived.copy(), done=done,
            last_arrive=c.last_arrive.copy(), pend_seq=c.pend_seq.copy(), pend_op=c.pend_op.copy(),
            pend_peer=c.pend_peer.copy(), pend_flags=c.pend_flags.copy(), pend_issue=c.pend_issue.copy(),
            pend_start=c.pend_start.copy(), p2p_in_flight=c.p2p_in_flight.copy(),
            tag=c.tag.copy(), opk=c.opk.copy(), p2p_done=dict(c.p2p_done), peer=_peer_rows(c, done),
        )  # fmt: skip


def _peer_rows(c: Comm, done: np.ndarray) -> np.ndarray:
    """c's PEER rows of the collectives that may be stuck, read part by part: ``Comm.peer_table``
    would join its parts, which decides what a later cap lets go (``join_peers`` does that where
    the graph read them)."""
    parts = c.peer_rows
    if not parts:
        return np.empty(0, schema.PEER)
    arr = np.maximum(c.n_arrived, done)
    ks = np.unique(done[c.hb_seen & ~c.gone & (c.grank >= 0) & (arr > done)])  # the graph's nodes
    m = c.members()
    if len(m) and len(ks):  # hang.WaitGraph._coll: stuck only where no member is behind or ahead
        ks = ks[(arr[m].min() > ks) & (done[m].max() <= ks)]
    if not len(ks):
        return np.empty(0, schema.PEER)
    return cat([p[np.isin(p["seq"].astype(np.int64), ks)] for p in parts], schema.PEER)


def busy_views(comms: dict[int, Comm], pool: Pool | None = None) -> dict[int, WaitView]:
    """Views of the communicators someone waits in, by index, in the order the graph visits
    them: those the pool names busy (ascending; ``pool`` holds every one of ``comms``), else
    every communicator in ``comms``' order. A communicator nobody waited in at the version it
    has now is skipped, and one found idle is marked so (``Comm.idle_version``): the mark is
    the communicators' own state, so it is set here, where they live."""
    if pool is None:
        todo = list(comms.values())
    else:
        wait, pend = pool.busy()
        todo = [comms[i] for i in np.union1d(wait, pend).tolist() if i in comms]
    out: dict[int, WaitView] = {}
    for c in todo:
        if c.idle_version == c.version:
            continue  # nobody waited in it at an earlier tick and nothing came since
        done = c.done_eff()
        live = c.hb_seen & ~c.gone & (c.grank >= 0)
        waits = (live & (np.maximum(c.n_arrived, done) > done)).any()
        pb = live & (c.pend_seq >= 0) & ((c.pend_flags & P2P) != 0) & (c.pend_start > 0)
        if not waits and not pb.any():
            c.idle_version = c.version
            continue
        out[c.idx] = WaitView.of(c, done)
    return out


def join_peers(comms: Mapping[int, Comm], read: Iterable[int]) -> None:
    """The communicators whose PEER rows a judge read from a copy (``hang.Evaluation.peers_read``,
    ``slow.SlowJudge.peers_read``) get them joined, as ``Comm.peer_table`` joined them when a
    judge read a ``Comm`` itself: how its parts lie decides what its cap lets go later
    (``Comm.add_peers``), so the evidence kept stays what it was. Run where the communicators
    are, before their next rows."""
    for i in read:
        c = comms.get(i)
        if c is not None:
            c.peer_table()
