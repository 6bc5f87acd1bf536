"""Fault SPEC parsing (DESIGN.md grammar) and lowering to simnccl's rank/link form."""

from __future__ import annotations

import pytest

from c4d import faults


def test_parse_and_lower():
    f = faults.parse("comm-slow@rank=3,step=5,factor=4", world=8)
    assert (f.kind, f.rank, f.step, f.factor) == ("comm-slow", 3, 5, 4.0)
    assert f.lower(4, 8) == ["comm-slow@rank=3,step=5,factor=4"]
    n = faults.parse("noncomm-hang@node=node-1", world=8, nodes=2)
    assert n.lower(4, 8) == [f"noncomm-hang@rank={r},step=0" for r in range(4, 8)]
    link = faults.parse("comm-hang@link=2-5", world=8)
    assert link.ranks(4, 8) == [2, 5] and link.lower(4, 8) == ["comm-hang@link=2-5,step=0"]


@pytest.mark.parametrize(
    "spec",
    [
        "bogus@rank=1",
        "comm-hang",
        "comm-hang@",
        "comm-hang@rank=1,node=node-0",
        "comm-hang@rank=x",
        "noncomm-hang@link=1-2",
        "noncomm-hang@rank=1,factor=2",
        "comm-slow@rank=1,factor=0.5",
        "comm-hang@rank=99",
        "comm-hang@link=3-3",
        "crash@node=node-9",
        "crash@node=gpu7",
        "crash@rank=1,rank=2",
        "crash@rank=1,step=-2",
        "crash@rank=1,color=red",
    ],
)
def test_bad_specs_get_one_line_reasons(spec):
    with pytest.raises(faults.FaultSpecError) as e:
        faults.parse(spec, world=8, nodes=2)
    assert "\n" not in str(e.value) and spec in str(e.value)
