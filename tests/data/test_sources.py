"""Reading JSON-lines / JSON / Parquet files into located rows."""

from __future__ import annotations

import json

import pytest

from rljax.data.errors import DataError
from rljax.data.sources import open_source

from .helpers import write_jsonl, write_parquet

ROWS = [{"a": i, "nested": {"x": [i, i + 1], "s": str(i)}} for i in range(5)]


def test_jsonl_rows_and_line_numbers(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS[:2]) + "\n\n   \n" + json.dumps(ROWS[2]) + "\n")
    src = open_source([str(path)])
    assert len(src) == 3  # blank lines are not rows
    assert [src[i].data for i in range(3)] == ROWS[:3]
    assert [(src[i].row, src[i].line, src[i].index) for i in range(3)] == [(0, 1, 0), (1, 2, 1), (2, 5, 2)]


def test_jsonl_parquet_json_agree(tmp_path):
    a = open_source(write_jsonl(tmp_path / "d.jsonl", ROWS))
    b = open_source(write_parquet(tmp_path / "d.parquet", ROWS))
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    c = open_source(str(tmp_path / "d.json"))
    for src in (a, b, c):
        assert [src[i].data for i in range(len(src))] == ROWS


def test_multiple_files_and_glob(tmp_path):
    write_jsonl(tmp_path / "p0.jsonl", ROWS[:2])
    write_parquet(tmp_path / "p1.parquet", ROWS[2:])
    src = open_source([str(tmp_path / "p0.jsonl"), str(tmp_path / "p1.parquet")])
    assert len(src) == 5
    r = src[3]
    assert (r.file.endswith("p1.parquet"), r.row, r.line, r.index, r.data) == (True, 1, None, 3, ROWS[3])
    write_jsonl(tmp_path / "p2.jsonl", ROWS[:1])
    assert len(open_source(str(tmp_path / "p*.jsonl"))) == 3


def test_non_json_line_names_file_row_and_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", ROWS[:3], raw_lines={2: "{not json"})
    src = open_source(path)
    assert src[1].data == ROWS[1]
    with pytest.raises(DataError, match=r"bad\.jsonl: row 2 \(line 3\): not valid JSON") as e:
        src[2]
    assert (e.value.file, e.value.row, e.value.line) == (path, 2, 3)


def test_non_object_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [ROWS[0], [1, 2]])
    with pytest.raises(DataError, match=r"row 1 \(line 2\): expected a JSON object, got list"):
        open_source(path)[1]


@pytest.mark.parametrize("name", ["data.csv", "data.txt", "data"])
def test_unknown_extension(tmp_path, name):
    path = tmp_path / name
    path.write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported data file extension") as e:
        open_source(str(path))
    assert e.value.file == str(path)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        open_source(str(tmp_path / "nope.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="empty.jsonl: file has no rows"):
        open_source(str(tmp_path / "empty.jsonl"))
    with pytest.raises(DataError, match="matched no files"):
        open_source(str(tmp_path / "*.parquet"))
