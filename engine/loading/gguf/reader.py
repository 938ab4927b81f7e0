"""The GGUF container: header, metadata and tensor directory parsed in Python; tensor data memory-mapped.

MLX's own GGUF loader is not used: it fails on a whole file when one tensor has a type it lacks (Q5_0, Q5_K,
...) and its Q4_K results differ from llama.cpp's (measured: tests/engine/test_gguf_quants.py).
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import UnsupportedCheckpoint
from engine.loading.gguf.quants import TYPES, dequantize_into, type_name

MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
          12: "<f8"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (GGUF lists the fastest-varying dimension first)
    ggml_type: int
    offset: int  # from the start of the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return type_name(self.ggml_type)

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class GGUFFile:
    """One .gguf file: `metadata` (plain Python values; numeric arrays as numpy) and `tensors` by name."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        with self.path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            self._read_header(buf)

    def _read_header(self, buf: mmap.mmap) -> None:
        """Metadata and tensor directory. Parsed from an mmap object: its slices are bytes, made ten times
        faster than a memoryview's (a 49k-token vocabulary and its merges: 0.26 s through memoryview slices)."""
        if bytes(buf[:4]) != MAGIC:
            raise UnsupportedCheckpoint(f"{self.path}: not a GGUF file (no GGUF magic)")
        self.version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if self.version not in (2, 3):
            raise UnsupportedCheckpoint(f"{self.path}: GGUF version {self.version} is not supported (2 or 3)")
        pos = 24
        self.metadata: dict[str, Any] = {}
        try:
            for _ in range(n_kv):
                key, pos = _string(buf, pos)
                (kind,), pos = struct.unpack_from("<I", buf, pos), pos + 4
                self.metadata[key], pos = _value(buf, pos, kind)
            infos = []
            for _ in range(n_tensors):
                name, pos = _string(buf, pos)
                (n_dims,), pos = struct.unpack_from("<I", buf, pos), pos + 4
                dims = struct.unpack_from(f"<{n_dims}Q", buf, pos)
                pos += 8 * n_dims
                ggml_type, offset = struct.unpack_from("<IQ", buf, pos)
                pos += 12
                infos.append((name, tuple(reversed(dims)), ggml_type, offset))
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            raise UnsupportedCheckpoint(f"{self.path}: truncated or corrupt GGUF header: {exc}") from exc
        alignment = int(self.metadata.get("general.alignment", 32))
        start = -(-pos // alignment) * alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, ggml_type, offset in infos:
            self.tensors[name] = TensorInfo(name, shape, ggml_type, start + offset, _nbytes(shape, ggml_type))
        end = max((t.offset + t.nbytes for t in self.tensors.values() if t.ggml_type in TYPES), default=start)
        if end > len(self._data):
            raise UnsupportedCheckpoint(f"{self.path}: truncated GGUF ({len(self._data)} bytes, tensors need {end})")

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str, default: Any = None) -> Any:
        """`{architecture}.{key}` from the metadata."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def raw(self, name: str) -> np.ndarray:
        """A tensor's bytes as stored (a view into the mapped file)."""
        info = self.tensors[name]
        return self._data[info.offset: info.offset + info.nbytes]

    def array(self, name: str) -> np.ndarray:
        """A tensor as numpy: F32/F16 as stored, BF16 as uint16 bits, block formats dequantized to float32."""
        info = self.tensors[name]
        if info.ggml_type not in TYPES:
            raise UnsupportedCheckpoint(f"{self.path}: tensor {name!r} has type {info.type_name}, which is not "
                                        f"supported (supported: {', '.join(t[0] for t in TYPES.values())})")
        _, block_values, block_bytes, dequantize = TYPES[info.ggml_type]
        raw = self.raw(name)
        if dequantize is None:
            dtype = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}[info.type_name]
            return raw.view(dtype).reshape(info.shape)
        values = dequantize(raw.reshape(-1, block_bytes))
        return values.reshape(info.shape)

    def blocks(self, name: str) -> int:
        """How many blocks a tensor in a block format holds (0 for a plain float tensor or an unread type)."""
        info = self.tensors[name]
        if info.ggml_type not in TYPES or TYPES[info.ggml_type][3] is None:
            return 0
        return info.n_elements // TYPES[info.ggml_type][1]

    def dequantize_into(self, name: str, out: np.ndarray, start: int, stop: int) -> None:
        """Blocks start:stop of a block-format tensor dequantized into `out` (float32 [stop - start, block
        values]): the values array() gives for them."""
        info = self.tensors[name]
        block_bytes = TYPES[info.ggml_type][2]
        dequantize_into(info.ggml_type, self.raw(name).reshape(-1, block_bytes)[start:stop], out)


def _nbytes(shape: tuple[int, ...], ggml_type: int) -> int:
    if ggml_type not in TYPES:
        return 0
    _, block_values, block_bytes, _ = TYPES[ggml_type]
    n = int(np.prod(shape, dtype=np.int64))
    return n // block_values * block_bytes


def _string(buf: mmap.mmap, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", buf, pos)
    pos += 8
    return bytes(buf[pos: pos + length]).decode("utf-8"), pos + length


def _value(buf: mmap.mmap, pos: int, kind: int) -> tuple[Any, int]:
    if kind == _STRING:
        return _string(buf, pos)
    if kind == _ARRAY:
        elem, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if elem == _STRING:
            return _strings(buf, pos, count)
        if elem in _NUMPY:
            arr = np.frombuffer(buf, dtype=_NUMPY[elem], count=count, offset=pos).copy()
            return arr, pos + arr.nbytes
        items = []
        for _ in range(count):
            item, pos = _value(buf, pos, elem)
            items.append(item)
        return items, pos
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        (value,) = struct.unpack_from(fmt, buf, pos)
        return value, pos + struct.calcsize(fmt)
    raise ValueError(f"unknown metadata value type {kind}")


def _strings(buf: mmap.mmap, pos: int, count: int) -> tuple[list[str], int]:
    """A string array (vocabularies of 250k entries): the loop only slices; one decode for all of them.

    0xFF never occurs in UTF-8, so it separates the pieces; a piece that is not UTF-8 keeps its bytes as
    surrogate escapes.
    """
    unpack = struct.Struct("<Q").unpack_from
    pieces = []
    at = pos
    for _ in range(count):
        (length,) = unpack(buf, at)
        at += 8
        pieces.append(buf[at: at + length])
        at += length
    joined = b"\xff".join(pieces)
    return (joined.decode("utf-8", "surrogateescape").split("\udcff") if count else []), at
