"""The corpus run's output: a Parquet file of vectors, written a row group at a time so that a run resumes.

The output is Parquet with an `id` column (the id field's values as text, or the row numbers as int64) and an
`embedding` column (fixed_size_list<float32, d>); its schema metadata holds `model` and `mlx_embed` (a JSON
object: the options the vectors depend on, the dimension, the row count). Each finished row group is written to
OUT.parquet.parts/ as its own file and recorded in that folder's manifest.json, so a killed run resumes
(--resume) after its last recorded group, recomputing nothing before it. At the end the parts become
OUT.parquet's row groups, in order, and the folder is removed: a resumed run writes the same file as an
uninterrupted one.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from compat.corpus.groups import Group
from compat.settings import SettingsError

MANIFEST = "manifest.json"


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

