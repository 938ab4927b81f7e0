"""mlx-embed's corpus mode: a corpus file to a Parquet file of vectors, in bounded memory, resumable.

The output is Parquet with an `id` column (the id field's values as text, or the row numbers as int64) and an
`embedding` column (fixed_size_list<float32, d>); its schema metadata holds `model` and `mlx_embed` (a JSON
object: the options the vectors depend on, the dimension, the row count). Rows are embedded `--rows-per-group`
at a time; each finished group is written to OUT.parquet.parts/ as its own file and recorded in that folder's
manifest.json, so a killed run resumes (--resume) after its last recorded group, recomputing nothing before it.
At the end the parts become OUT.parquet's row groups, in order, and the folder is removed: a resumed run writes
the same file as an uninterrupted one. Bad rows are reported on stderr with their line (row) number and id and
counted, and make the exit status 1.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from compat.corpus_files import CorpusReader, Row, fingerprint, number_word
from compat.settings import EmbedCommand, SettingsError
from compat.tools import model_ref

MANIFEST = "manifest.json"


class JobFailed(Exception):
    """The corpus job stopped (its finished row groups stay for --resume); the command prints it and exits 1."""


@dataclass
class Group:
    """One row group's outcome: `rows_in` input rows, the ids and vectors of those embedded, and the failures
    as (number, id, reason)."""

    rows_in: int
    ids: list[str | int] = field(default_factory=list)
    vectors: list[np.ndarray] = field(default_factory=list)
    failures: list[tuple[int, str | int, str]] = field(default_factory=list)

    def add(self, row: Row, vector: np.ndarray | None, error: str | None) -> None:
        if error is None:
            self.ids.append(row.id)
            self.vectors.append(vector)
        else:
            self.failures.append((row.number, row.id, error))


def job_description(command: EmbedCommand, name: str, ref: str, reader: CorpusReader) -> dict[str, Any]:
    """Everything the vectors and the file's layout depend on: a resumed run must match it exactly."""
    # offline only says where the files came from; threads and batch sizes stay (they move float rounding).
    options = {key: (value.value if hasattr(value, "value") else value)
               for key, value in command.engine_kwargs().items() if key != "offline"}
    return {"model": name, "ref": ref, "input": fingerprint(reader.path), "format": reader.format,
            "text_field": command.text_field, "id_field": command.id_field if reader.ids_from_field else None,
            "rows_per_group": command.rows_per_group, "embd_normalize": command.embd_normalize,
            "dimensions": command.dimensions, "prompt_name": command.prompt_name,
            "instruction": command.instruction, "engine": options}


def output_metadata(job: dict[str, Any], dimension: int, rows: int) -> dict[bytes, bytes]:
    """The final file's schema metadata: the model and the options (not where the input was, nor how it ran)."""
    kept = {key: value for key, value in job.items() if key not in ("model", "ref", "input")}
    return {b"model": job["model"].encode(),
            b"mlx_embed": json.dumps({**kept, "dimension": dimension, "rows": rows}, sort_keys=True).encode()}


class PartStore:
    """OUT.parquet.parts/: a Parquet file per finished row group and manifest.json listing them."""

    def __init__(self, output: Path, job: dict[str, Any], resume: bool, notes: TextIO):
        self.output = output
        self.folder = output.with_name(output.name + ".parts")
        self.job = job
        self.parts: list[dict[str, Any]] = []
        manifest = self.folder / MANIFEST
        recorded = json.loads(manifest.read_text(encoding="utf-8")) if manifest.is_file() else {"parts": []}
        if recorded["parts"]:  # a run that finished nothing left nothing to lose: it starts over
            if not resume:
                raise SettingsError(f"{self.folder} holds an interrupted run: add --resume to continue it, or "
                                    f"delete the folder to start over")
            if recorded["job"] != job:
                changed = sorted(k for k in {*job, *recorded["job"]} if job.get(k) != recorded["job"].get(k))
                raise SettingsError(f"--resume: {self.folder} was written by a different job (it differs in: "
                                    f"{', '.join(changed)}); delete the folder to start over")
            self.parts = recorded["parts"]
            notes.write(f"resuming after {self.rows_done} rows ({len(self.parts)} row groups done)\n")
        else:
            if resume:
                notes.write(f"nothing to resume in {self.folder}: starting from the first row\n")
            self.folder.mkdir(parents=True, exist_ok=True)
            self._save()

    @property
    def rows_done(self) -> int:
        return sum(part["rows_in"] for part in self.parts)

    def earlier_failures(self) -> list[tuple[int, str | int, str]]:
        return [tuple(failure) for part in self.parts for failure in part["failures"]]

    def add(self, group: Group) -> None:
        """Record one finished group: its file first, then the manifest that names it (both atomic)."""
        name = None
        if group.ids:
            name = f"part-{len(self.parts):06d}.parquet"
            temporary = self.folder / (name + ".tmp")
            pq.write_table(group_table(group), temporary)
            os.replace(temporary, self.folder / name)
        self.parts.append({"file": name, "rows_in": group.rows_in, "rows_out": len(group.ids),
                           "failures": [list(f) for f in group.failures]})
        self._save()

    def _save(self) -> None:
        temporary = self.folder / (MANIFEST + ".tmp")
        temporary.write_text(json.dumps({"job": self.job, "parts": self.parts}), encoding="utf-8")
        os.replace(temporary, self.folder / MANIFEST)

    def finish(self) -> tuple[int, int] | None:
        """Join the parts into the output file, one row group each; (rows, dimension), None when no row was
        embedded (then no file is written)."""
        files = [self.folder / part["file"] for part in self.parts if part["file"]]
        if not files:
            shutil.rmtree(self.folder)
            return None
        rows = sum(part["rows_out"] for part in self.parts)
        dimension = pq.read_schema(files[0]).field("embedding").type.list_size
        temporary = self.output.with_name("." + self.output.name + ".tmp")
        writer = None
        for path in files:
            table = pq.read_table(path)
            if writer is None:
                schema = table.schema.with_metadata(output_metadata(self.job, dimension, rows))
                writer = pq.ParquetWriter(temporary, schema)
            writer.write_table(table.replace_schema_metadata(writer.schema.metadata), row_group_size=table.num_rows)
        assert writer is not None
        writer.close()
        os.replace(temporary, self.output)
        shutil.rmtree(self.folder)
        return rows, dimension


def group_table(group: Group) -> pa.Table:
    vectors = np.stack(group.vectors).astype(np.float32, copy=False)
    ids = pa.array(group.ids, pa.string() if isinstance(group.ids[0], str) else pa.int64())
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), vectors.shape[1])
    return pa.table({"id": ids, "embedding": embedding})


def chunks(rows: Iterable[Row], size: int) -> Iterator[list[Row]]:
    chunk: list[Row] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def local_groups(command: EmbedCommand, ref: str, reader: CorpusReader) -> Iterator[Group]:
    """Embed in this process: one engine, a row group at a time."""
    from engine import Encoder

    with Encoder(ref, **command.engine_kwargs()) as encoder:
        for chunk in chunks(reader, command.rows_per_group):
            texts = [row.text for row in chunk if row.error is None]
            encoded = encoder.encode_rows(texts, **command.encode_kwargs())
            group = Group(len(chunk))
            results = iter(zip(encoded.vectors, encoded.errors))
            for row in chunk:
                group.add(row, *(next(results) if row.error is None else (None, row.error)))
            yield group


class Progress:
    """A one-line progress bar (rows, texts/s, ETA) on a terminal; silent otherwise."""

    def __init__(self, stream: TextIO, reader: CorpusReader, enabled: bool, rows_before: int = 0):
        """rows_before: rows an earlier run finished (--resume); they count as done, not in the rate."""
        self.stream, self.reader, self.enabled = stream, reader, enabled
        self.started = time.monotonic()
        self.rows, self.embedded = rows_before, 0
        self._shown = 0.0
        self._first: tuple[float, int] | None = None  # (time, position) at the first group: the ETA's base

    def update(self, group: Group, final: bool = False) -> None:
        self.rows += group.rows_in
        self.embedded += len(group.ids)
        now = time.monotonic()
        if not self.enabled or (now - self._shown < 0.5 and not final):
            return
        self._shown = now
        elapsed = max(now - self.started, 1e-9)
        line = f"{self.rows} rows, {self.embedded / elapsed:.1f} texts/s"
        size, position = self.reader.size, self.reader.position()
        if size:
            line += f", {100 * min(position / size, 1.0):.1f}%"
            # the rate since the first group (the model's load and skipped rows left out) over what is left
            if self._first is None:
                self._first = (now, position)
            elif position > self._first[1] and position < size:
                remaining = (size - position) * (now - self._first[0]) / (position - self._first[1])
                line += f", ETA {int(remaining // 60)}:{int(remaining % 60):02d}"
        self.stream.write("\r" + line.ljust(60))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")


def describe_failure(source: Path, word: str, number: int, row_id: str | int, reason: str) -> str:
    """`FILE: line N (id X): reason`; rows numbered by line have no other id."""
    named = f" (id {row_id})" if row_id != number else ""
    return f"{source}: {word} {number}{named}: {reason}"


def run_command(command: EmbedCommand, progress_to: TextIO = sys.stderr) -> int:
    """mlx-embed --input FILE --output OUT.parquet: exit status 0, or 1 when any row failed."""
    if command.prompt:
        raise SettingsError("give either texts (-p) or a corpus (--input), not both")
    if command.json_output:
        raise SettingsError("--json prints the vectors of -p texts; a corpus is written to --output")
    if not command.output:
        raise SettingsError("--input needs --output OUT.parquet")
    source = Path(command.input)
    if not source.exists():
        raise SettingsError(f"--input {source}: no such file")
    output = Path(command.output)
    ref, name = model_ref(command, bundled_default=True)
    started = time.monotonic()
    reader = CorpusReader(source, command.text_field, command.id_field)
    job = job_description(command, name, ref, reader)
    store = PartStore(output, job, command.resume, progress_to)
    reader.skip = store.rows_done
    word = number_word(reader.format)
    failures = store.earlier_failures()
    for failure in failures:
        progress_to.write(describe_failure(source, word, *failure) + " [earlier run]\n")
    progress = Progress(progress_to, reader, enabled=progress_to.isatty() and not command.quiet,
                        rows_before=store.rows_done)
    if command.ray:
        try:
            from compat.corpus_ray import ray_groups
        except ImportError as exc:
            raise SettingsError(f"--ray needs Ray Data ({exc}): pip install 'mlx-embed-server[ray]'") from None
        groups = ray_groups(command, ref, reader)
    else:
        groups = local_groups(command, ref, reader)
    for group in groups:
        store.add(group)
        progress.update(group)
        for failure in group.failures:
            progress_to.write(("\n" if progress.enabled else "") + describe_failure(source, word, *failure) + "\n")
        failures += group.failures
    progress.close()
    written = store.finish()
    seconds = time.monotonic() - started
    if written is None:
        progress_to.write(f"no row could be embedded ({len(failures)} failed): {output} not written\n")
        return 1
    rows, dimension = written
    progress_to.write(f"wrote {output}: {rows} vectors of {dimension} values; this run embedded "
                      f"{progress.embedded} in {seconds:.1f} s ({progress.embedded / max(seconds, 1e-9):.1f} "
                      f"texts/s, the model's load included)\n")
    if failures:
        progress_to.write(f"{len(failures)} row{'s' if len(failures) != 1 else ''} failed and "
                          f"{'are' if len(failures) != 1 else 'is'} not in {output}\n")
        return 1
    return 0
