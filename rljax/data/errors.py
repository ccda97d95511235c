"""Errors of the data pipeline.

Two kinds:

* `DataError` — something is wrong with an input file or one of its rows. Its message
  always names the file, and where it applies the row (0-based record index in that file;
  for JSON-lines files also the 1-based line number) and the offending key, e.g.
  ``data/train.jsonl: row 3 (line 4), key 'messages[1].content': expected a string``.
  The same facts are attributes (`file`, `row`, `line`, `key`) for programs.
* `FormatError` — raised by the location-free helpers (chat rendering, message
  validation, truncation); the per-format transforms catch it and re-raise it as a
  `DataError` that carries the file, row and full key.

Both subclass `ValueError`.
"""

from __future__ import annotations


class FormatError(ValueError):
    """A value has the wrong shape; `key` is a path relative to the caller's key.

    `key` is written as it would follow a column name: ``"[2].content"`` or
    ``".ground_truth"``, so that ``column + key`` reads ``messages[2].content``.
    """

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.message = message
        self.key = key


class DataError(ValueError):
    """A problem with a data file or one of its rows (see the module docstring)."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        row: int | None = None,
        line: int | None = None,
        key: str | None = None,
    ):
        self.message = message
        self.file = file
        self.row = row
        self.line = line
        self.key = key
        where = file if file is not None else "<data>"
        if row is not None:
            where += f": row {row}"
            if line is not None:
                where += f" (line {line})"
        if key is not None:
            where += f", key {key!r}"
        super().__init__(f"{where}: {message}")
