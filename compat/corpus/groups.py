"""What a corpus run is made of, shared by both runners (the local one in job.py, the Ray one in
ray_runner.py): the rows cut into row groups, each group's outcome, and the error that stops a job."""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from compat.corpus.files import Row


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


def chunks(rows: Iterable[Row], size: int) -> Iterator[list[Row]]:
    """`rows` in lists of `size`, the last one shorter when they do not divide evenly."""
    chunk: list[Row] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
