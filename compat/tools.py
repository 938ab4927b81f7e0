"""mlx-embed and mlx-rerank: the server's engine from a shell, through engine.Encoder / engine.Reranker.

Text output is for people (vectors, a cosine matrix, a ranking); `--json` prints one object with the numbers
as the server prints them (float32 values widened to double, shortest round-trip form).
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import orjson

from compat.settings import EmbedCommand, RerankCommand, SettingsError
from compat.wire.rerank import ranked_indices
from engine import DEFAULT_MODEL_NAME, Encoder, ImageInput, Reranker, default_model, maxsim
from engine.errors import EngineError
from engine.types import RerankItem

__all__ = ["EngineError", "embed_texts", "rerank_documents"]

_PREVIEW = 40  # characters of a text shown beside its row


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr, force=True,
                        format="%(levelname).1s %(name)s: %(message)s")


def model_ref(command: EmbedCommand | RerankCommand, *, bundled_default: bool) -> tuple[str, str]:
    """(what to load, the name reported): -m, else -hf, else (mlx-embed) the bundled default model."""
    if command.model:
        return command.model, command.model
    if command.hf_repo:
        return command.hf_repo, command.hf_repo
    bundled = default_model() if bundled_default else None
    if bundled is None:
        raise SettingsError("no model given: use -m PATH or -hf REPO" +
                            (" (the bundled default model is not installed)" if bundled_default else ""))
    return bundled, DEFAULT_MODEL_NAME


def _json(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def _preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _PREVIEW else flat[:_PREVIEW - 3] + "..."


def cosine_matrix(vectors: np.ndarray) -> np.ndarray:
    """Cosine similarity of every pair of rows (whatever their normalization); a zero row gives 0."""
    rows = vectors.astype(np.float64)
    norms = np.linalg.norm(rows, axis=1)
    unit = np.divide(rows, norms[:, None], out=np.zeros_like(rows), where=norms[:, None] > 0)
    return unit @ unit.T


MULTI_VECTOR_NORMALIZE = ("--embd-normalize {value}: a multi-vector model's token vectors are each L2-normalized by "
                          "the model, and used as they are (the server answers them so and /maxsim scores them "
                          "so); no other normalization applies: leave --embd-normalize at its default")


def embed_texts(command: EmbedCommand, out: TextIO) -> int:
    if given := command.corpus_flags_given():
        raise SettingsError(f"{', '.join(given)}: corpus mode options; give --input FILE (and --output)")
    if not command.prompt and not command.image:
        raise SettingsError("nothing to embed: give -p TEXT or --image FILE (repeatable), or --input FILE "
                            "--output OUT.parquet")
    images = [_read_image(path) for path in command.image]
    ref, name = model_ref(command, bundled_default=True)
    labels = [*command.prompt, *(f"[image] {path}" for path in command.image)]
    with Encoder(ref, **command.engine_kwargs()) as encoder:
        if command.task is not None and (images or encoder.info.multi_vector):
            raise SettingsError(f"--task: only the texts of a model with task adapters (jina-embeddings-v3) run a "
                                f"task; {'images' if images else 'a multi-vector model'} take none")
        if encoder.info.multi_vector:
            if command.dimensions is not None:
                raise SettingsError("--dimensions: a multi-vector model keeps its token vectors' full width")
            if command.normalize_given():  # the server's embedding routes and /maxsim use the rows as they come
                raise SettingsError(MULTI_VECTOR_NORMALIZE.format(value=command.embd_normalize))
            found = encoder.embed_token_vectors(command.prompt, images, batch_size=command.batch_size or None,
                                                prompt_name=command.prompt_name, instruction=command.instruction)
            return _print_token_vectors(found.rows, found.n_tokens, labels, name, command.json_output, out)
        parts = []
        if command.prompt:
            parts.append(encoder.embed(command.prompt, **command.encode_kwargs()))
        if images:
            parts.append(encoder.embed_images(images, normalize=command.embd_normalize, dimensions=command.dimensions,
                                              batch_size=command.batch_size or None, prompt_name=command.prompt_name,
                                              instruction=command.instruction))
    vectors = np.concatenate([part.vectors for part in parts])
    n_tokens = [n for part in parts for n in part.n_tokens]
    similarity = cosine_matrix(vectors)
    if command.json_output:
        out.write(_json({"model": name, "embeddings": vectors.astype(np.float64),
                         "prompt_tokens": sum(n_tokens), "similarity": similarity}).decode() + "\n")
        return 0
    for i, (vector, count) in enumerate(zip(vectors, n_tokens)):
        out.write(f"embedding {i} ({count} tokens, {len(vector)} values): "
                  + " ".join(f"{x:.6f}" for x in vector) + "\n")
    _print_matrix("cosine similarity matrix", similarity, labels, out)
    return 0


def maxsim_matrix(rows: list[np.ndarray]) -> np.ndarray:
    """MaxSim of every input (as the query, the row) against every input (as the document, the column)."""
    return np.array([[maxsim(query, document) for document in rows] for query in rows])


def _print_token_vectors(rows: list[np.ndarray], n_tokens: list[int], labels: list[str], name: str,
                         json_output: bool, out: TextIO) -> int:
    """A multi-vector model's answer: each input's token rows, and the MaxSim matrix in place of cosine."""
    similarity = maxsim_matrix(rows)
    if json_output:
        out.write(_json({"model": name, "embeddings": [r.astype(np.float64) for r in rows],
                         "shapes": [list(r.shape) for r in rows], "prompt_tokens": sum(n_tokens),
                         "similarity_kind": "maxsim", "similarity": similarity}).decode() + "\n")
        return 0
    for i, (vectors, count) in enumerate(zip(rows, n_tokens)):
        out.write(f"embedding {i} ({count} tokens, {vectors.shape[0]} rows of {vectors.shape[1]} values):\n")
        for row in vectors:
            out.write("  " + " ".join(f"{x:.6f}" for x in row) + "\n")
    _print_matrix("MaxSim similarity matrix (row: the query, column: the document; raw sums over the query's "
                  "token vectors)", similarity, labels, out)
    return 0


def _print_matrix(title: str, matrix: np.ndarray, labels: list[str], out: TextIO) -> None:
    if len(labels) < 2:
        return
    out.write(f"\n{title}:\n")
    out.write(" " * 4 + "".join(f"{j:>9}" for j in range(len(labels))) + "\n")
    for i, row in enumerate(matrix):
        out.write(f"{i:>4}" + "".join(f"{x:>9.4f}" for x in row) + f"   {_preview(labels[i])}\n")


def _read_image(path: str, flag: str = "--image") -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise SettingsError(f"{flag} {path}: {exc.strerror or exc}") from None


def rerank_documents(command: RerankCommand, out: TextIO) -> int:
    if (command.query is None and command.query_image is None) or not (command.document or command.image):
        raise SettingsError("give a query and at least one document: -q QUERY -d DOC [-d DOC ...] "
                            "(or --query-image FILE, --image FILE)")
    query: RerankItem = command.query or ""
    if command.query_image is not None:
        image = _read_image(command.query_image, "--query-image")
        query = ImageInput((image, command.query) if command.query else (image,))
    documents: list[RerankItem] = [*command.document, *(ImageInput.image(_read_image(path)) for path in command.image)]
    labels = [*command.document, *(f"[image] {path}" for path in command.image)]
    ref, name = model_ref(command, bundled_default=False)
    with Reranker(ref, **command.engine_kwargs()) as reranker:
        scores, n_tokens = reranker.score(query, documents, instruction=command.instruction)
        kind = reranker.kind
    order = ranked_indices(list(scores), command.top_n)
    if command.json_output:
        ranking = [{"index": i, "score": float(scores[i])} for i in order]
        out.write(_json({"model": name, "scores": scores, "ranking": ranking, "kind": kind,
                         "prompt_tokens": sum(n_tokens)}).decode() + "\n")
        return 0
    for i, score in enumerate(scores):
        out.write(f"score {i}: {score:.6f}   {_preview(labels[i])}\n")
    out.write("\nranking:\n")
    for place, i in enumerate(order, 1):
        out.write(f"{place:>4}. document {i}  {scores[i]:.6f}   {_preview(labels[i])}\n")
    return 0
