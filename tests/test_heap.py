"""c4d.util.heap: the master's process reuses the pages of the large arrays it freed (one chunk's)
instead of faulting fresh ones in for the next; counted as the minor page faults of a real
process (getrusage) allocating and touching a 64 MiB array ten times, with and without (glibc
maps a block above 32 MiB afresh each time however often one was freed: the judge's window of a
large job; below it, the pages freed at the heap's top beyond twice the last such block go back)."""

import json
import subprocess
import sys

import pytest

PROBE = r"""
import json, resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from c4d.util import heap
    assert heap.keep_freed_blocks()
faults = []
for _ in range(10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(8 << 20)  # 64 MiB, written
    a += 1
    del a
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""


def _probe(code: str, mode: str) -> list[int]:
    """A probe's counts (its JSON line) from a fresh process, in ``mode``."""
    out = subprocess.run(
        [sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout)


def test_freed_chunk_arrays_are_reused_not_faulted_in_again():
    from c4d.util import heap

    if not heap.keep_freed_blocks():
        pytest.skip("not glibc: the allocator is left as it is")
    plain, keep = _probe(PROBE, "plain"), _probe(PROBE, "keep")
    # after the first array, each new one is fresh pages without, the same pages with
    assert sum(plain[2:]) >= 8 * 32, plain
    assert sum(keep[2:]) * 4 <= sum(plain[2:]), (keep, plain)


GC_PROBE = r"""
import gc, json, sys
if sys.argv[1] == "rare":
    from c4d.util import heap
    heap.collect_rarely()
runs = [0, 0, 0]
def count(phase, info):
    if phase == "stop":
        runs[info["generation"]] += 1
gc.callbacks.append(count)
kept = [[i] for i in range(200_000)]  # long-lived containers, as the engine's state for many ranks
for i in range(400_000):  # short-lived ones (a chunk's tuples and lists): freed, not counted
    t = (i, [i])
print(json.dumps(runs))
"""


def test_cyclic_collections_are_rare_and_full_ones_rarer():
    """c4d.util.heap.collect_rarely: a pass over the young objects every 50,000 containers kept
    (Python's 700), the full pass over every object far rarer."""
    plain, rare = _probe(GC_PROBE, "plain"), _probe(GC_PROBE, "rare")
    assert plain[0] >= 200 and plain[2] >= 2, plain
    assert rare[0] * 30 <= plain[0] and rare[2] == 0, (rare, plain)


def test_the_master_collects_rarely():
    import gc

    from c4d.master.master import Master, MasterConfig
    from c4d.util import heap

    m = Master(MasterConfig(bind="tcp://127.0.0.1:*"))
    try:
        assert all(a >= b for a, b in zip(gc.get_threshold(), heap.GC_THRESHOLDS, strict=True))
    finally:
        m.close()


def test_an_import_asks_numpy_for_small_pages_and_gives_its_setting_back(monkeypatch):
    """c4d.util.heap.without_huge_pages around the Flight Recorder import: numpy's huge-page advice is
    off while the dumps are read and converted, and numpy's own setting is back after it, also
    when the block raises."""
    from pathlib import Path

    from c4d.formats import flight_recorder as fr
    from c4d.util import heap

    switch = heap._madvise_switch()
    if switch is None:
        pytest.skip("this numpy has no huge-page switch")

    def setting() -> bool:
        was = switch(False)
        switch(was)
        return was

    seen = []
    convert = fr.convert

    def spy(*a, **kw):
        seen.append(setting())
        return convert(*a, **kw)

    monkeypatch.setattr(fr, "convert", spy)
    before = switch(True)
    try:
        fr.read(Path(__file__).parent / "data" / "fr_gloo" / "lost-pending")
        assert seen == [False] and setting() is True
        with pytest.raises(RuntimeError), heap.without_huge_pages():
            assert setting() is False
            raise RuntimeError("inside")
        assert setting() is True
    finally:
        switch(before)
