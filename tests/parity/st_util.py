"""Pure-Python safetensors reader/writer for tests (the `safetensors`
package is not installed here).

It follows the reference implementation (huggingface/safetensors,
safetensors/src/tensor.rs): data sorted by dtype alignment (largest first)
then name, compact JSON header with "__metadata__" first, padded with
spaces to a multiple of 8, little-endian row-major data; the reader applies
the same validation (offsets contiguous from 0 and covering the buffer,
byte sizes matching shapes).
"""
import json
import struct

import numpy as np
import torch

DTYPES = {
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F64": torch.float64,
    "I32": torch.int32,
    "I64": torch.int64,
    "U8": torch.uint8,
}
NAMES = {v: k for k, v in DTYPES.items()}
# Position in the reference's Dtype enum (alignment order).
RANK = {"U8": 1, "F16": 7, "BF16": 8, "I32": 9, "F32": 11, "F64": 12, "I64": 13}
SIZE = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I32": 4, "I64": 8, "U8": 1}
MAX_HEADER = 100_000_000


def tensor_bytes(t):
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().astype("<i2").tobytes()
    return t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()


def tensor_from(buf, dtype, shape):
    if dtype == "BF16":
        a = np.frombuffer(buf, dtype="<i2").copy()
        return torch.from_numpy(a).view(torch.bfloat16).reshape(shape)
    np_dtype = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I32": "<i4", "I64": "<i8", "U8": "u1"}[dtype]
    a = np.frombuffer(buf, dtype=np_dtype).copy()
    return torch.from_numpy(a).reshape(shape)


def serialize(tensors, metadata=None):
    """bytes of a safetensors file for {name: tensor} and {str: str}."""
    items = sorted(tensors.items(), key=lambda kv: (-RANK[NAMES[kv[1].dtype]], kv[0]))
    header = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    off = 0
    blobs = []
    for name, t in items:
        b = tensor_bytes(t)
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def save(path, tensors, metadata=None):
    with open(path, "wb") as f:
        f.write(serialize(tensors, metadata))


class FormatError(ValueError):
    pass


def _no_dupes(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise FormatError("duplicate key")
    return dict(pairs)


def deserialize(data):
    """(tensors, metadata) from file bytes; FormatError on invalid input."""
    if len(data) < 8:
        raise FormatError("header too small")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER or 8 + n > len(data):
        raise FormatError("invalid header length")
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"), object_pairs_hook=_no_dupes)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(str(e))
    if not isinstance(header, dict):
        raise FormatError("header is not an object")
    metadata = header.pop("__metadata__", None)
    buf = memoryview(data)[8 + n :]  # slices of a memoryview copy nothing
    entries = sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"]))
    at = 0
    out = {}
    for name, info in entries:
        dtype, shape, (b, e) = info["dtype"], info["shape"], info["data_offsets"]
        if b != at or e < b:
            raise FormatError("invalid offset for %s" % name)
        numel = 1
        for d in shape:
            numel *= d
        if numel * SIZE[dtype] != e - b:
            raise FormatError("size mismatch for %s" % name)
        out[name] = tensor_from(buf[b:e], dtype, shape)
        at = e
    if at != len(buf):
        raise FormatError("buffer not covered")
    return out, metadata


def load(path):
    with open(path, "rb") as f:
        return deserialize(f.read())
