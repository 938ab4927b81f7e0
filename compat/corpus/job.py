"""mlx-embed's corpus mode: a corpus file to a Parquet file of vectors (output.py), in bounded memory,
resumable. Rows are embedded `--rows-per-group` at a time, in this process (local_groups) or on Ray Data
(ray_runner.py). Bad rows are reported on stderr with their line (row) number and id and counted, and make the
exit status 1.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from compat.corpus.files import CorpusReader, fingerprint, number_word
from compat.corpus.groups import Group, chunks
from compat.corpus.output import PartStore
from compat.settings import EmbedCommand, SettingsError
from compat.tools import model_ref
from engine import Pooling, token_vectors_reason


def job_description(command: EmbedCommand, name: str, ref: str, reader: CorpusReader) -> dict[str, Any]:
    """Everything the vectors and the file's layout depend on: a resumed run must match it exactly."""
    # offline only says where the files came from; threads and batch sizes stay (they move float rounding).
    options = {key: (value.value if hasattr(value, "value") else value)
               for key, value in command.engine_kwargs().items() if key != "offline"}
    return {"model": name, "ref": ref, "input": fingerprint(reader.path), "format": reader.format,
            "text_field": command.text_field, "id_field": command.id_field if reader.ids_from_field else None,
            "rows_per_group": command.rows_per_group, "embd_normalize": command.embd_normalize,
            "dimensions": command.dimensions, "prompt_name": command.prompt_name,
            "instruction": command.instruction, **({"task": command.task} if command.task is not None else {}),
            "engine": options}


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


def check_one_vector_per_row(command: EmbedCommand, ref: str, name: str) -> None:
    """A corpus file gets one vector per row: a model that gives one per token (a multi-vector model, or
    --pooling none) is refused before anything is loaded or written, on Ray as in this process."""
    reason = token_vectors_reason(ref, **command.engine_kwargs())
    if reason is None:
        return
    advice = ("give --pooling mean (or cls, last) for one vector per row" if command.pooling is Pooling.NONE else
              "serve it (mlx-embed-server) for its token vectors and /maxsim scores")
    raise SettingsError(f"--input: {name} {reason}, and a corpus run writes one vector per row; nothing was "
                        f"written: {advice}")


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
    check_one_vector_per_row(command, ref, name)
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
            from compat.corpus.ray_runner import ray_groups
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
