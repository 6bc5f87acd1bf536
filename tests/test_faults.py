"""Fault SPEC parsing (docs/cli.md grammar) and lowering to simnccl's rank/link form."""

from __future__ import annotations

import pytest

from c4d.sim import faults


def test_parse_and_lower():
    plain = faults.block_layout(8, 4)
    assert plain == ["node-0"] * 4 + ["node-1"] * 4
    f = faults.parse("comm-slow@rank=3,step=5,factor=4", world=8)
    assert (f.kind, f.rank, f.step, f.factor) == ("comm-slow", 3, 5, 4.0)
    assert f.lower(plain) == ["comm-slow@rank=3,step=5,factor=4"]
    n = faults.parse("noncomm-hang@node=node-1", world=8, nodes=2)
    assert n.lower(plain) == [f"noncomm-hang@rank={r},step=0" for r in range(4, 8)]
    link = faults.parse("comm-hang@link=2-5", world=8)
    assert link.ranks(plain) == [2, 5] and link.lower(plain) == ["comm-hang@link=2-5,step=0"]


def test_a_node_fault_follows_the_node_not_the_rank():
    """Resolved against the actual layout: node-1 excluded, its fault applies to no rank."""
    n = faults.parse("noncomm-hang@node=node-1,step=5", world=8, nodes=3)
    assert n.ranks(["node-0"] * 4 + ["node-2"] * 4) == []
    assert n.lower(["node-0"] * 4 + ["node-2"] * 4) == []
    # node-1 now hosts the second half of the ranks of another layout: the fault goes with it
    assert n.ranks(["node-2"] * 4 + ["node-1"] * 4) == [4, 5, 6, 7]
    assert n.ranks(["node-1", "node-0", "node-1", "node-0"]) == [0, 2]


def test_hardware_model_keys_round_trip():
    """dir= picks a link's direction, until= ends a slowdown, secs= makes a compute hang a stall; each
    survives lowering for simnccl and printing back as a SPEC."""
    d = faults.parse("comm-slow@link=2-5,dir=rev,step=3,until=9,factor=2.5", world=8)
    assert (d.dir, d.until, d.factor, d.transient) == ("rev", 9, 2.5, True)
    assert d.lower(faults.block_layout(8, 4)) == ["comm-slow@link=2-5,dir=rev,step=3,until=9,factor=2.5"]
    h = faults.parse("noncomm-hang@rank=1,step=4,secs=1.5", world=8)
    assert h.secs == 1.5 and h.lower(faults.block_layout(8, 4)) == ["noncomm-hang@rank=1,step=4,secs=1.5"]
    m = faults.parse("mismatch@rank=3,step=7", world=8)
    assert m.kind == "mismatch" and not m.transient
    for f in (d, h, m):
        assert faults.parse(f.spec(), world=8) == f


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
        "comm-hang@rank=1,dir=fwd",
        "comm-hang@link=1-2,dir=up",
        "noncomm-hang@rank=1,until=9",
        "comm-slow@rank=1,step=5,until=5",
        "comm-slow@rank=1,secs=2",
        "comm-hang@rank=1,secs=2",
        "noncomm-hang@rank=1,secs=0",
        "mismatch@link=1-2",
        "mismatch@rank=1,factor=2",
    ],
)
def test_bad_specs_get_one_line_reasons(spec):
    with pytest.raises(faults.FaultSpecError) as e:
        faults.parse(spec, world=8, nodes=2)
    assert "\n" not in str(e.value) and spec in str(e.value)


def test_sim_layout_skips_excluded_nodes_and_uses_spares():
    from c4d.sim.sim import SimConfig

    cfg = SimConfig(ranks=8, ranks_per_node=4, spare_nodes=1, exclude_nodes=("node-1", "elsewhere"))
    cfg.validate()
    assert cfg.cluster == ["node-0", "node-1", "node-2"]
    assert cfg.node_names == ["node-0", "node-2"]
    assert cfg.layout == ["node-0"] * 4 + ["node-2"] * 4
    assert SimConfig(ranks=8, ranks_per_node=4, spare_nodes=1).node_names == ["node-0", "node-1"]
    short = SimConfig(ranks=8, ranks_per_node=4, exclude_nodes=("node-0",))
    with pytest.raises(ValueError, match="--spare-nodes"):
        short.validate()


@pytest.mark.parametrize(
    "spec, says",
    [
        # the separator between the kind and its keys, not "unknown kind"
        ("noncomm-hang:rank=6", "separated by '@', not ':': noncomm-hang@rank=6"),
        ("comm-slow,link=1-2", "separated by '@', not ','"),
        ("crash rank=1", "separated by '@', not ' '"),
        ("bogus@rank=1", "unknown kind 'bogus'"),
        ("noncomm-hangs@rank=1", "unknown kind 'noncomm-hangs'"),
        ("@rank=1", "no kind before '@'"),
        ("comm-hang", "no keys after the kind"),
        # an unknown key names it; a bad value names the key and the value
        ("crash@rank=1,color=red", "unknown key 'color'"),
        ("crash@rnak=1", "unknown key 'rnak'"),
        ("crash@rank", "'rank' is not key=value"),
        ("crash@rank=", "rank= has no value"),
        ("crash@rank=1,", "an empty item"),
        ("comm-hang@rank=x", "rank='x' is not an integer"),
        ("comm-hang@rank=1,step=1.5", "step='1.5' is not an integer"),
        ("comm-slow@rank=1,step=2,until=soon", "until='soon' is not an integer"),
        ("comm-slow@rank=1,factor=fast", "factor='fast' is not a number"),
        ("noncomm-hang@rank=1,secs=abc", "secs='abc' is not a number"),
        ("comm-hang@link=1", "link='1' is not R-S"),
        ("comm-hang@link=a-b", "link='a-b' is not R-S"),
    ],
)
def test_errors_name_the_part_that_is_wrong(spec, says):
    with pytest.raises(faults.FaultSpecError) as e:
        faults.parse(spec, world=8, nodes=2)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_the_cli_says_what_is_wrong_with_a_spec_in_one_line():
    import subprocess

    from tests.conftest import c4d_cmd

    p = subprocess.run(
        c4d_cmd("sim", "--fault", "noncomm-hang:rank=6"), capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [
        "c4d sim: fault 'noncomm-hang:rank=6': the kind and its keys are separated by '@', not ':': "
        "noncomm-hang@rank=6"
    ]
