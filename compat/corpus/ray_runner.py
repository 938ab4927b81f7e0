"""mlx-embed --ray: the corpus job as a Ray Data pipeline.

read_datasource (the corpus file, read by compat/corpus/files.py as the single-process run reads it: same row
numbers, ids, bad rows and --resume starting row) -> map_batches on a pool of --ray-actors actors, each holding
one engine.Encoder -> the rows stream back to this process in input order and are written by the same PartStore,
so the Parquet file is the one a single-process run writes.
"""
from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import ray
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask
from ray.exceptions import RayError

from compat.corpus.files import CorpusReader, Row
from compat.corpus.groups import Group, JobFailed, chunks
from compat.settings import EmbedCommand

_SOURCE_ROOT = Path(__file__).resolve().parents[2]


class CorpusDatasource(Datasource):
    """One read task streaming the file in blocks of `block_rows` rows: number, id (text; null when the row's id
    is its number), text and the reader's error ("" for none)."""

    def __init__(self, path: Path, text_field: str, id_field: str, skip: int, ids_from_field: bool,
                 block_rows: int):
        super().__init__()
        self._args = (path, text_field, id_field, skip, ids_from_field)
        self._block_rows = block_rows

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        path = self._args[0]
        metadata = BlockMetadata(num_rows=None, size_bytes=None, input_files=[str(path)], exec_stats=None)
        return [ReadTask(self._blocks, metadata)]

    def _blocks(self) -> Iterator[pa.Table]:
        path, text_field, id_field, skip, ids_from_field = self._args
        reader = CorpusReader(path, text_field, id_field, skip, ids_from_field)
        for chunk in chunks(reader, self._block_rows):
            yield pa.table({
                "number": pa.array([row.number for row in chunk], pa.int64()),
                "id": pa.array([row.id if isinstance(row.id, str) else None for row in chunk], pa.string()),
                "text": pa.array([row.text for row in chunk], pa.string()),
                "error": pa.array([row.error or "" for row in chunk], pa.string()),
            })


class CorpusEncoder:
    """A Ray actor: one engine.Encoder; a batch of rows in, their vectors (zeros for failed rows) and errors out."""

    def __init__(self, ref: str, options: dict[str, Any], encode: dict[str, Any]):
        from engine import Encoder

        self._encoder = Encoder(ref, **options)
        self._encode = encode

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        errors = [str(e) for e in batch["error"]]
        good = [i for i, e in enumerate(errors) if not e]
        encoded = self._encoder.encode_rows([str(batch["text"][i]) for i in good], **self._encode)
        vectors = np.zeros((len(errors), encoded.vectors.shape[1]), np.float32)
        vectors[good] = encoded.vectors
        for i, error in zip(good, encoded.errors):
            errors[i] = error or ""
        return {"number": batch["number"], "id": batch["id"], "embedding": vectors,
                "error": np.array(errors, dtype=object)}


def _runtime_env() -> dict[str, Any]:
    """From a source checkout (not an installed package), workers import this checkout's engine and compat."""
    if (_SOURCE_ROOT / "pyproject.toml").is_file():
        return {"env_vars": {"PYTHONPATH": str(_SOURCE_ROOT)}}
    return {}


def ray_groups(command: EmbedCommand, ref: str, reader: CorpusReader) -> Iterator[Group]:
    """The job's row groups, computed by the actor pool, in input order."""
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=command.ray_address, logging_level="WARNING", log_to_driver=False,
                 **({} if command.ray_address else {"include_dashboard": False}))
    if not command.verbose:  # Ray Data's execution reports and its warning about our single read task
        logging.getLogger("ray.data").setLevel(logging.WARNING)
        warnings.filterwarnings("ignore", module="ray.data")
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # rows come back in input order: the same row groups
    context.enable_progress_bars = False
    cpus = command.threads if command.threads > 0 else 1
    options = {**command.engine_kwargs(), "threads": cpus}
    encode = command.encode_kwargs()
    runtime_env = _runtime_env()
    source = CorpusDatasource(reader.path, reader.text_field, reader.id_field, reader.skip, reader.ids_from_field,
                              command.rows_per_group)
    try:
        # reading is I/O: it takes no CPU from the actors' budget (else N actors on N CPUs starve it), and its
        # blocks stay whole (one per row group)
        dataset = ray.data.read_datasource(source, num_cpus=0, override_num_blocks=1, runtime_env=runtime_env)
        dataset = dataset.map_batches(
            CorpusEncoder, fn_constructor_args=(ref, options, encode), batch_size=command.rows_per_group,
            batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=command.ray_actors), num_cpus=cpus,
            runtime_env=runtime_env)
        group = Group(0)
        for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
            for number, row_id, vector, error in zip(batch["number"], batch["id"], batch["embedding"],
                                                     batch["error"]):
                row = Row(int(number), int(number) if row_id is None else str(row_id), None)
                group.add(row, vector, str(error) or None)
                group.rows_in += 1
                if group.rows_in == command.rows_per_group:
                    yield group
                    group = Group(0)
        if group.rows_in:
            yield group
    except RayError as exc:  # an actor could not load the model, a worker died, ...
        raise JobFailed(f"the Ray job failed (finished row groups are kept for --resume): {exc}") from None
    finally:
        if started_here:
            ray.shutdown()
