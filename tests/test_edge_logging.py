"""Rate-limited logging (c4d/util/ratelog.py) and the Prometheus counters that carry the detail the
log leaves out (c4d/master/metrics.py), with a clock the test controls."""

from __future__ import annotations

import logging
from typing import ClassVar

from prometheus_client import generate_latest

from c4d.engine import Engine, EngineConfig
from c4d.intake.ingest import Ingest
from c4d.intake.validate import Edge, Limits
from c4d.master.metrics import Metrics
from c4d.util.ratelog import RateLimitedLog
from tests import hostile as H


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_one_line_per_reason_class_per_minute_with_counts(caplog):
    clock = Clock()
    rl = RateLimitedLog(logging.getLogger("c4d.test"), clock=clock)
    with caplog.at_level(logging.WARNING, logger="c4d.test"):
        for i in range(100_000):  # issue 14: the value was in the key, so 100,000 lines
            rl("bad magic", "dropped a malformed message: bad magic 0x%08x", i)
            rl("short message", "dropped a malformed message of %d bytes", i % 16)
        assert rl.lines == 2
        clock.t += 59.0
        rl.flush()
        assert rl.lines == 2  # the minute is not over
        clock.t += 1.0
        rl.flush()  # the storm stopped: the counts are still told, once per class
        assert rl.lines == 4
        clock.t += 61.0
        rl("bad magic", "dropped a malformed message: bad magic 0x%08x", 7)
        rl.flush()
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 5
    assert "bad magic: and 99999 more like it, 99999 records, in the last 60 s" in msgs
    assert msgs[-1] == "dropped a malformed message: bad magic 0x00000007"


def test_the_metrics_carry_every_reason_and_forget_freed_communicators():
    t = H.now_ns()
    m = Metrics()
    sink = [m.ingest]
    eng = Engine(EngineConfig(), split=True)  # the metrics read the engine's own waits (OP_SPLIT rows)
    ing = Ingest(eng, Edge(Limits(comm_idle_s=1)), sinks=sink, on_free=[m.forget])
    ing.feed(H.as_header(H.registers(8, t), H.comm_init(range(8), H.WORLD_COMM, 8, t)), t)
    ing.feed(H.as_header(H.allreduces(8, range(6), t)), t)
    bad = H.allreduces(8, [6], t)
    bad["op"] = 200
    ing.feed(H.as_header(bad), t)

    class Coll:
        bad_reasons: ClassVar[dict[str, int]] = {"bad magic": 3}

    ing.tick(t)
    m.tick(0, 3, None, eng.take_split())
    m.edge(ing.edge, Coll, ing)
    text = generate_latest(m.registry).decode()
    assert 'c4d_records_rejected_total{reason="bad op"} 8.0' in text
    assert 'c4d_bad_messages_by_reason_total{reason="bad magic"} 3.0' in text
    comm = f"{H.WORLD_COMM:016x}"
    assert f'c4d_wait_seconds_count{{comm="{comm}",op="AllReduce"}}' in text
    ing.tick(t + 5 * 10**9)  # silent for 5 s > comm_idle_s: freed, its series removed
    text = generate_latest(m.registry).decode()
    assert comm not in text
    m.edge(ing.edge, Coll, ing)  # totals unchanged: counters not double counted
    assert 'c4d_records_rejected_total{reason="bad op"} 8.0' in generate_latest(m.registry).decode()
