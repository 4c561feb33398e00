"""Reading and writing ``.safetensors`` files with numpy, bfloat16 included.

The format is an 8-byte little-endian header length, a JSON header
``{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}``
and the raw little-endian tensor bytes. The ``safetensors`` package's numpy
front end has no bfloat16, which is what SGLang checkpoints hold, so this module
handles the format directly (with ``ml_dtypes`` for bfloat16); tensors are read
through a memory map.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path

import ml_dtypes
import numpy as np

DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in DTYPES.items()}
MAX_HEADER = 100 << 20


class SafetensorsError(ValueError):
    """A file that is not valid safetensors."""


def read_header(path: str | Path) -> tuple[dict, int]:
    """The JSON header of a file and the offset its data starts at."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise SafetensorsError(f"{path}: too short for a safetensors file")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER:
            raise SafetensorsError(f"{path}: header of {n} bytes is too large")
        header = json.loads(fh.read(n))
    return header, 8 + n


def load_file(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of one file, as read-only numpy arrays backed by a memory map."""
    header, start = read_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=start)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in DTYPES:
            raise SafetensorsError(f"{path}: {name} has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        shape = tuple(info["shape"])
        if end - begin != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise SafetensorsError(f"{path}: {name} has {end - begin} bytes for shape {shape}")
        out[name] = data[begin:end].view(dtype).reshape(shape)
    return out


def save_file(
    tensors: Mapping[str, np.ndarray], path: str | Path, metadata: Mapping[str, str] | None = None
) -> int:
    """Write tensors (names sorted, 8-byte aligned header); returns the bytes of tensor data."""
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    arrays = []
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        if arr.dtype not in _NAMES:
            raise SafetensorsError(f"{name}: cannot store dtype {arr.dtype}")
        header[name] = {
            "dtype": _NAMES[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
        arrays.append(arr)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(blob)))
        fh.write(blob)
        for arr in arrays:
            fh.write(arr.tobytes())
    return offset
