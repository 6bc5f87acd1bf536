"""c4d.record.columns: every field of every record kind, cut from the transposed words, is bit for bit
what the structured view gives (random bytes: NaNs, negative values, names without a NUL)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from c4d.record import schema
from c4d.record.columns import Columns

DTYPES = [schema.HEADER, *schema.DTYPES.values()]


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=0, max_size=schema.RECORD_SIZE * 9), st.integers(0, len(DTYPES) - 1))
def test_every_field_equals_the_structured_view(data, which):
    dt = DTYPES[which]
    n = len(data) // schema.RECORD_SIZE
    rows = np.frombuffer(data[: n * schema.RECORD_SIZE], dt)
    cols = Columns.of(rows)
    assert len(cols) == n
    for name in dt.names:
        want, got = rows[name], cols[name]
        assert got.dtype == want.dtype.base and got.shape == want.shape, name
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), name


def test_kinds_share_cut_fields_and_take_keeps_rows():
    rng = np.random.default_rng(3)
    rows = np.frombuffer(rng.bytes(schema.RECORD_SIZE * 50), schema.HEADER)
    cols = Columns.of(rows)
    op = cols.as_kind(schema.OP)
    hb = cols.as_kind(schema.HEARTBEAT)
    assert op["comm_id"] is hb["comm_id"]  # one offset and type: cut once
    assert op["comm_rank"].tobytes() == rows.view(schema.OP)["comm_rank"].tobytes()
    idx = np.array([3, 1, 49, 3])
    sub = cols.take(idx).as_kind(schema.OPSUM)
    want = rows.view(schema.OPSUM)[idx]
    for name in ("seq", "compute_ns", "op", "comm_nranks"):
        assert sub[name].tobytes() == np.ascontiguousarray(want[name]).tobytes(), name
    mask = rng.random(50) < 0.5
    assert cols.take(mask)["time_ns"].tolist() == rows["time_ns"][mask].tolist()
