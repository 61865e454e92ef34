"""GGUF files read in one pass: metadata as Python values, tensors as byte views of the mapped file.

- `read(path)` parses the header, every metadata value and every tensor's name, type, shape and offset.
  A tokenizer's ~100,000 strings take a fraction of a second; gguf's own reader builds numpy views of
  every part of every field, seconds for the same file, on each start that reads it.
- Tensors stay in the memory-mapped file: `GGUFTensor.data` is the uint8 (or float) array that
  `gguf.quants.dequantize` takes, shaped as gguf's reader shapes it.
- GGUF versions 2 and 3 (64-bit counts), little-endian, as llama.cpp writes them.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType

_NUMBERS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor: its name, ggml type, dimensions innermost first (as GGUF stores them) and its bytes."""

    name: str
    type: GGMLQuantizationType
    dims: tuple[int, ...]
    data: np.ndarray


@dataclass(frozen=True)
class GGUFFile:
    """A GGUF file's metadata (key → value: int, float, bool, str or a list of them) and tensors in file order."""

    fields: dict[str, object]
    tensors: list[GGUFTensor]


class _Cursor:
    """Reads values one after another from a buffer."""

    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer, self.at = buffer, 0

    def scalar(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.buffer, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.scalar("<Q")
        self.at += size
        return self.buffer[self.at - size:self.at].decode("utf-8")

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar("<I"), self.scalar("<Q")
            if item == _STRING:
                return [self.string() for _ in range(count)]
            if item == _ARRAY:
                return [self.value(_ARRAY) for _ in range(count)]
            return self.numbers(item, count).tolist()
        return self.numbers(kind, 1)[0].item()

    def numbers(self, kind: int, count: int) -> np.ndarray:
        if kind not in _NUMBERS:
            raise ValueError(f"unknown GGUF value type {kind}")
        items = np.frombuffer(self.buffer, _NUMBERS[kind], count, self.at)
        self.at += items.nbytes
        return items


def read(path: str | Path) -> GGUFFile:
    """The file's metadata and its tensors' views; ValueError where it is not a GGUF file this reads."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # what a GGUF file needs only (~50 ms to import)

    with open(path, "rb") as f:
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    cursor = _Cursor(buffer)
    if buffer[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    cursor.at = 4
    version = cursor.scalar("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} of {path} is not read (2 and 3 are)")
    n_tensors, n_fields = cursor.scalar("<Q"), cursor.scalar("<Q")
    fields = {}
    for _ in range(n_fields):
        key = cursor.string()
        fields[key] = cursor.value(cursor.scalar("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cursor.string()
        dims = tuple(cursor.scalar("<Q") for _ in range(cursor.scalar("<I")))
        infos.append((name, cursor.scalar("<I"), dims, cursor.scalar("<Q")))
    alignment = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
    start = -(-cursor.at // alignment) * alignment
    tensors = []
    for name, kind, dims, offset in infos:
        kind = GGMLQuantizationType(kind)
        block, size = GGML_QUANT_SIZES[kind]
        shape = (*reversed(dims[1:]), dims[0] // block * size)
        data = np.frombuffer(buffer, np.uint8, int(np.prod(shape)), start + offset).reshape(shape)
        tensors.append(GGUFTensor(name, kind, dims, data))
    return GGUFFile(fields, tensors)
