"""Format detection by content, and ``load_any``'s errors."""

from __future__ import annotations

import gzip
import json
import pickle

import pytest

from c4d.formats.detect import detect, load_any
from c4d.formats.to_records import FormatError
from c4d.record import schema
from c4d.record.trace import TraceWriter
from tests import fr_factory as frf
from tests.records import ops, register
from tests.test_import_inspector import write_logs
from tests.test_import_nccl_tests import FILES


def test_c4d_trace(tmp_path):
    p = tmp_path / "job.trace"  # the name says nothing: detection reads the magic
    w = TraceWriter(p, {"command": "test"})
    w.write(register(0, "node-0").view(schema.HEADER))
    w.write(ops(3).view(schema.HEADER))
    w.close()
    assert detect(p) == "c4d"
    rt = load_any(p)
    assert len(rt.kinds[schema.Kind.OP]) == 3


def test_flight_recorder_directory_file_and_json(tmp_path):
    d = tmp_path / "fr"
    frf.write(frf.build(frf.Job(tp=2, dp=2, steps=2)), d, prefix="trace_")
    assert detect(d) == "fr"
    assert detect(d / "trace_3") == "fr"
    one = load_any(d / "trace_3")
    assert one.kinds[schema.Kind.REGISTER]["rank"].tolist() == [3]
    j = tmp_path / "dump.json"
    j.write_text(json.dumps({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []}))
    assert detect(j) == "fr"


def test_inspector_file_dir_and_gzip(tmp_path):
    d = tmp_path / "insp"
    lines = write_logs(d, verbose=False, steps=1)
    assert detect(d) == "inspector"
    f = next(d.iterdir())
    assert detect(f) == "inspector"
    gz = tmp_path / "x.jsonl.gz"
    gz.write_bytes(gzip.compress(lines[0][0].encode()))
    assert detect(gz) == "inspector"


def test_nccl_tests_text_and_json(tmp_path):
    assert {detect(f) for f in FILES} == {"nccl-tests"}
    j = tmp_path / "r.json"
    j.write_text(json.dumps({"config": {}, "devices": [], "results": []}))
    assert detect(j) == "nccl-tests"


@pytest.mark.parametrize(
    "content",
    [b"", b"hello world\n", bytes(range(256)) * 4, b'{"some": "json"}\n', gzip.compress(b"plain text")],
    ids=["empty", "text", "binary", "other-json", "other-gzip"],
)
def test_garbage_file_is_one_line(tmp_path, content):
    p = tmp_path / "mystery.dat"
    p.write_bytes(content)
    with pytest.raises(FormatError) as ei:
        detect(p)
    assert "\n" not in str(ei.value) and "mystery.dat" in str(ei.value)
    with pytest.raises(FormatError):
        load_any(p)


def test_missing_and_empty_paths(tmp_path):
    with pytest.raises(FormatError, match="no such file"):
        detect(tmp_path / "nope")
    with pytest.raises(FormatError, match="holds no"):
        detect(tmp_path)


def test_forced_format_that_does_not_fit(tmp_path):
    p = tmp_path / "not-a-dump"
    p.write_bytes(pickle.dumps({"x": 1}, protocol=2))
    with pytest.raises(FormatError) as ei:
        load_any(p, "fr")
    assert "\n" not in str(ei.value)
    with pytest.raises(FormatError, match="unknown format"):
        load_any(p, "csv")
    with pytest.raises(FormatError, match="not a c4d trace"):
        load_any(p, "c4d")
