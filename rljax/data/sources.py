"""Random-access record sources over JSON-lines, JSON and Parquet files.

`open_source(files)` returns a `RecordSource`: a sequence of `Row`s (one per record, the
files concatenated in the order given) that grain's `MapDataset.source` can index.

* ``.jsonl`` — one JSON object per line; blank lines are skipped (they are not rows).
  Files are indexed once (byte offsets) and each line is parsed when it is read, so a
  non-JSON line raises a `DataError` naming file, row and line when it is reached.
* ``.json`` — a JSON array of objects, or (if the first character is not ``[``) JSON lines.
* ``.parquet`` — read with pyarrow; nested columns (``reward_model: {style, ground_truth}``,
  ``prompt: list<struct<role, content>>``) come back as Python dicts and lists.

Row numbers are 0-based record indices within a file; JSON-lines rows also carry their
1-based line number. A pattern containing ``*``, ``?`` or ``[`` is expanded with `glob`
(sorted). Any other extension is a `DataError`.
"""

from __future__ import annotations

import bisect
import contextlib
import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np

from rljax.data.errors import DataError, FormatError

SUPPORTED_EXTENSIONS: tuple[str, ...] = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class Row:
    """One record and where it came from.

    `index` is the record's position in the concatenation of all files of the source;
    `padding` marks the filler rows that keep validation batches full (no data).
    """

    file: str
    row: int
    line: int | None
    data: dict[str, Any] = field(repr=False)
    index: int = -1
    padding: bool = False

    def error(self, message: str, key: str | None = None) -> DataError:
        """A `DataError` located at this row."""
        return DataError(message, file=self.file, row=self.row, line=self.line, key=key)

    def require(self, key: str) -> Any:
        """`data[key]`, or a `DataError` naming the missing key."""
        if key not in self.data:
            raise self.error(f"missing key {key!r} (row has keys {sorted(self.data)})", key=key)
        return self.data[key]

    @contextlib.contextmanager
    def context(self, key: str) -> Iterator[None]:
        """Turn a `FormatError` raised inside into a `DataError` at this row and `key`."""
        try:
            yield
        except FormatError as e:
            full_key = key + (e.key or "")
            raise self.error(e.message, key=full_key) from e


PADDING_ROW = Row(file="<padding>", row=-1, line=None, data={}, padding=True)


class _JsonLinesFile:
    """Byte-offset index over a JSON-lines file; lines are parsed on access."""

    def __init__(self, path: str):
        self.path = path
        offsets: list[int] = []
        lengths: list[int] = []
        lines: list[int] = []
        pos = 0
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                if raw.strip():
                    offsets.append(pos)
                    lengths.append(len(raw))
                    lines.append(lineno)
                pos += len(raw)
        self._offsets = np.asarray(offsets, dtype=np.int64)
        self._lengths = np.asarray(lengths, dtype=np.int64)
        self._lines = np.asarray(lines, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._offsets)

    def get(self, i: int) -> Row:
        line = int(self._lines[i])
        with open(self.path, "rb") as f:
            f.seek(int(self._offsets[i]))
            raw = f.read(int(self._lengths[i]))
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"not valid JSON: {e}", file=self.path, row=i, line=line) from None
        if not isinstance(data, dict):
            raise DataError(
                f"expected a JSON object, got {type(data).__name__}",
                file=self.path, row=i, line=line,
            )
        return Row(file=self.path, row=i, line=line, data=data)


class _JsonArrayFile:
    """A ``.json`` file holding one array of objects (loaded eagerly)."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
            try:
                records = json.load(f)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise DataError(f"not valid JSON: {e}", file=path) from None
        if not isinstance(records, list):
            raise DataError("expected a JSON array of objects", file=path)
        self._records = records

    def __len__(self) -> int:
        return len(self._records)

    def get(self, i: int) -> Row:
        data = self._records[i]
        if not isinstance(data, dict):
            raise DataError(
                f"expected a JSON object, got {type(data).__name__}", file=self.path, row=i
            )
        return Row(file=self.path, row=i, line=None, data=data)


class _ParquetFile:
    """A Parquet file, kept as an Arrow table; rows become Python dicts on access."""

    def __init__(self, path: str):
        import pyarrow.parquet as pq

        self.path = path
        try:
            self._table = pq.read_table(path)
        except Exception as e:  # pyarrow raises several types for unreadable files
            raise DataError(f"cannot read Parquet file: {e}", file=path) from e

    def __len__(self) -> int:
        return self._table.num_rows

    def get(self, i: int) -> Row:
        data = self._table.slice(i, 1).to_pylist()[0]
        return Row(file=self.path, row=i, line=None, data=data)


def _open_file(path: str) -> _JsonLinesFile | _JsonArrayFile | _ParquetFile:
    lower = path.lower()
    if not (lower.endswith(".jsonl") or lower.endswith(".json") or lower.endswith(".parquet")):
        ext = os.path.splitext(path)[1] or "(none)"
        raise DataError(
            f"unsupported data file extension {ext!r}; expected one of "
            f"{', '.join(SUPPORTED_EXTENSIONS)}",
            file=path,
        )
    if not os.path.isfile(path):
        raise DataError("no such file", file=path)
    if lower.endswith(".parquet"):
        return _ParquetFile(path)
    if lower.endswith(".json"):
        with open(path, "rb") as f:
            head = f.read(4096).lstrip()
        if head.startswith(b"["):
            return _JsonArrayFile(path)
    return _JsonLinesFile(path)


def expand_files(files: Sequence[str] | str) -> list[str]:
    """The list of paths: a single string is one path; glob patterns are expanded."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    out: list[str] = []
    for f in files:
        f = os.fspath(f)
        if any(c in f for c in "*?["):
            matched = sorted(glob.glob(f))
            if not matched:
                raise DataError("glob pattern matched no files", file=f)
            out.extend(matched)
        else:
            out.append(f)
    return out


class RecordSource(Sequence[Row]):
    """All rows of several files, concatenated; `source[i]` is a `Row`."""

    def __init__(self, files: Sequence[str] | str):
        self.files = expand_files(files)
        if not self.files:
            raise DataError("no data files given")
        self._parts = [_open_file(f) for f in self.files]
        sizes = [len(p) for p in self._parts]
        self._starts = np.cumsum([0] + sizes).tolist()
        for f, n in zip(self.files, sizes):
            if n == 0:
                raise DataError("file has no rows", file=f)

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, index: int) -> Row:  # type: ignore[override]
        index = int(index)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        part = bisect.bisect_right(self._starts, index) - 1
        row = self._parts[part].get(index - self._starts[part])
        return Row(file=row.file, row=row.row, line=row.line, data=row.data, index=index)

    def __repr__(self) -> str:
        return f"RecordSource({len(self)} rows from {self.files})"


class PaddedSource(Sequence[Row]):
    """`source` followed by `PADDING_ROW`s up to `length` (keeps eval batches full)."""

    def __init__(self, source: RecordSource, length: int):
        self.source = source
        self.length = max(length, len(source))

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Row:  # type: ignore[override]
        index = int(index)
        return self.source[index] if index < len(self.source) else PADDING_ROW


def open_source(files: Sequence[str] | str) -> RecordSource:
    """Open JSON-lines / JSON / Parquet files as one random-access `RecordSource`."""
    return RecordSource(files)
