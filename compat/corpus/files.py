"""Corpus files read as a stream of rows: JSON lines, CSV, Parquet or plain text (one document per line).

Nothing is read ahead beyond one line (one Parquet batch), so a corpus larger than memory streams through.
Every row keeps its 1-based number (the line for text and JSON lines, the record for CSV and Parquet), so a bad
row is reported where it is. A row's id is the id field's value (as text) when the input has that field,
otherwise its number.
"""
from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Format = Literal["jsonl", "csv", "parquet", "text"]
_EXTENSIONS: dict[str, Format] = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv",
                                  ".parquet": "parquet", ".pq": "parquet"}
_PARQUET_BATCH = 1024  # rows decoded at a time


@dataclass(frozen=True)
class Row:
    number: int  # 1-based line (text, JSON lines) or record (CSV, Parquet)
    id: str | int  # the id field's value as text, or `number`
    text: str | None  # None when `error` says why there is none
    error: str | None = None


def file_format(path: Path) -> Format:
    return _EXTENSIONS.get(path.suffix.lower(), "text")


def number_word(fmt: Format) -> str:
    """What a row's number counts, for messages."""
    return "line" if fmt in ("jsonl", "text") else "row"


class CorpusReader:
    """The rows of one corpus file, from row `skip` + 1 on; `position()` / `size` give the progress in bytes
    (None for a pipe) or, for Parquet, in rows."""

    def __init__(self, path: Path, text_field: str, id_field: str, skip: int = 0,
                 ids_from_field: bool | None = None):
        """ids_from_field: whether ids come from `id_field`; None: decide from the input (a resumed run passes
        what the first run decided)."""
        self.path = path
        self.format = file_format(path)
        self.text_field = text_field
        self.id_field = id_field
        self.skip = skip
        self.ids_from_field = self._has_id_field() if ids_from_field is None else ids_from_field
        self.size: int | None = self._size()
        self.position: Callable[[], int] = lambda: 0

    def _size(self) -> int | None:
        if self.format == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(self.path).metadata.num_rows
        return self.path.stat().st_size if self.path.is_file() else None  # a FIFO has no size

    def _has_id_field(self) -> bool:
        """Parquet / CSV: the column exists; JSON lines: the first object has the key; text: never."""
        if self.format == "parquet":
            import pyarrow.parquet as pq

            return self.id_field in pq.ParquetFile(self.path).schema_arrow.names
        if self.format == "text" or not self.path.is_file():  # a pipe cannot be peeked at: number its rows
            return False
        with open(self.path, "rb") as f:
            if self.format == "csv":
                header = next(csv.reader(io.TextIOWrapper(f, encoding="utf-8", newline="")), [])
                return self.id_field in header
            for line in f:
                if line.strip():
                    try:
                        first = json.loads(line)
                    except ValueError:
                        return False
                    return isinstance(first, dict) and self.id_field in first
        return False

    def __iter__(self) -> Iterator[Row]:
        return {"jsonl": self._jsonl, "csv": self._csv, "parquet": self._parquet, "text": self._text}[self.format]()

    # -- formats ------------------------------------------------------------------------------------------------
    def _lines(self) -> Iterator[tuple[int, bytes]]:
        with open(self.path, "rb") as f:
            self.position = f.tell if self.size is not None else (lambda: 0)
            for number, line in enumerate(f, 1):
                if number > self.skip:
                    yield number, line

    def _text(self) -> Iterator[Row]:
        for number, raw in self._lines():
            try:
                text = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                yield Row(number, number, None, f"not UTF-8 ({exc.reason} at byte {exc.start})")
                continue
            yield self._row(number, {self.text_field: text})

    def _jsonl(self) -> Iterator[Row]:
        for number, raw in self._lines():
            try:
                record = json.loads(raw)
            except ValueError as exc:
                yield Row(number, number, None, f"not valid JSON: {exc}")
                continue
            if not isinstance(record, dict):
                yield Row(number, number, None, f"a JSON {type(record).__name__}, not an object")
                continue
            yield self._row(number, record)

    def _csv(self) -> Iterator[Row]:
        with open(self.path, "rb") as raw:
            self.position = raw.tell if self.size is not None else (lambda: 0)
            records = csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8", newline=""))
            for number, record in enumerate(records, 1):
                if number > self.skip:
                    yield self._row(number, record)

    def _parquet(self) -> Iterator[Row]:
        import pyarrow.parquet as pq

        source = pq.ParquetFile(self.path)
        names = source.schema_arrow.names
        columns = [c for c in (self.text_field, self.id_field if self.ids_from_field else None) if c in names]
        done = 0
        self.position = lambda: done
        for batch in source.iter_batches(batch_size=_PARQUET_BATCH, columns=columns or None):
            start = done
            done += batch.num_rows
            if done <= self.skip:
                continue
            table = batch.to_pydict()
            texts = table.get(self.text_field, [None] * batch.num_rows)
            ids = table.get(self.id_field, [None] * batch.num_rows)
            for offset in range(max(0, self.skip - start), batch.num_rows):
                record = {self.text_field: texts[offset]} if self.text_field in table else {}
                if self.ids_from_field:
                    record[self.id_field] = ids[offset]
                yield self._row(start + offset + 1, record)

    # -- one record -----------------------------------------------------------------------------------------
    def _row(self, number: int, record: dict[str, Any]) -> Row:
        row_id: str | int = number
        if self.ids_from_field:
            value = record.get(self.id_field)
            if value is None or value == "":
                return Row(number, number, None, f"no {self.id_field!r} (the other rows have one)")
            row_id = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        text = record.get(self.text_field)
        if text is None:
            return Row(number, row_id, None, f"no {self.text_field!r} field")
        if not isinstance(text, str):
            return Row(number, row_id, None, f"{self.text_field!r} is a {type(text).__name__}, not a string")
        if not text.strip():
            return Row(number, row_id, None, "empty text")
        return Row(number, row_id, text)


def fingerprint(path: Path) -> dict[str, Any]:
    """What identifies an input file for --resume: its absolute path, size and modification time."""
    stat = os.stat(path)
    regular = path.is_file()
    return {"path": str(path.resolve()), "size": stat.st_size if regular else None,
            "mtime_ns": stat.st_mtime_ns if regular else None}
