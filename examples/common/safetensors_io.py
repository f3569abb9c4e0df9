"""Read and write the safetensors format without the `safetensors` package.

The format (https://github.com/huggingface/safetensors): an unsigned 64-bit
little-endian header length N, N bytes of JSON mapping each tensor name to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the
byte buffer after the header) plus an optional ``"__metadata__"`` dict of
strings, then the raw little-endian tensor bytes.

Hugging Face checkpoints come as one ``model.safetensors`` or as shards listed
in ``model.safetensors.index.json`` (``{"weight_map": {name: file}}``);
`load_dir` reads either. Files are memory-mapped (copy-on-write), so loading
a large checkpoint does not read it twice.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path

import torch

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}
_MAX_HEADER = 100 * 2**20


def read_header(path) -> tuple[dict, int]:
    """(header dict, offset of the data buffer) of a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", raw)
        if n > _MAX_HEADER:
            raise ValueError(f"{path}: safetensors header of {n} bytes is implausibly large")
        header = json.loads(f.read(n).decode("utf-8"))
    return header, 8 + n


def load_file(path, device="cpu") -> dict[str, torch.Tensor]:
    """All tensors of one safetensors file, by name."""
    header, start = read_header(path)
    size = os.path.getsize(path)
    out = {}
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size > start else None
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        shape = tuple(int(s) for s in info["shape"])
        begin, end = (int(o) for o in info["data_offsets"])
        numel = 1
        for s in shape:
            numel *= s
        itemsize = torch.empty((), dtype=dtype).element_size()
        if end - begin != numel * itemsize or start + end > size:
            raise ValueError(f"{path}: tensor {name!r} data_offsets {begin}..{end} do not match "
                             f"its shape {list(shape)} and dtype {info['dtype']}")
        if numel == 0:
            t = torch.empty(shape, dtype=dtype)
        else:
            t = torch.frombuffer(mm, dtype=dtype, count=numel, offset=start + begin).reshape(shape)
        out[name] = t if str(device) == "cpu" else t.to(device)
    return out


def metadata(path) -> dict:
    return read_header(path)[0].get("__metadata__", {}) or {}


def save_file(tensors: dict[str, torch.Tensor], path, metadata: dict | None = None) -> None:
    """Write `tensors` (any device; copied to the host) as one safetensors file."""
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach()
        if t.dtype not in _NAMES:
            raise ValueError(f"cannot store {name!r} of dtype {t.dtype} in safetensors")
        t = t.to("cpu").contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data buffer starts 8-byte aligned
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load_dir(path) -> dict[str, torch.Tensor]:
    """The state dict of a Hugging Face checkpoint directory (one file or shards), or a file."""
    path = Path(path)
    if path.is_file():
        return load_file(path)
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        out = {}
        for fname in sorted(set(weight_map.values())):
            out.update(load_file(path / fname))
        missing = set(weight_map) - set(out)
        if missing:
            raise ValueError(f"{path}: shards lack {sorted(missing)[:5]}")
        return out
    single = path / "model.safetensors"
    if single.exists():
        return load_file(single)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors checkpoint in {path}")
    out = {}
    for f in files:
        out.update(load_file(f))
    return out


def save_dir(tensors: dict[str, torch.Tensor], path, *, max_shard_bytes: int | None = None,
             metadata: dict | None = None) -> None:
    """Write a Hugging Face style checkpoint directory, sharded above `max_shard_bytes`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta = {"format": "pt", **(metadata or {})}
    names = sorted(tensors)
    total = sum(tensors[n].numel() * tensors[n].element_size() for n in names)
    if max_shard_bytes is None or total <= max_shard_bytes:
        save_file(tensors, path / "model.safetensors", meta)
        return
    shards, cur, cur_bytes = [], [], 0
    for n in names:
        b = tensors[n].numel() * tensors[n].element_size()
        if cur and cur_bytes + b > max_shard_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(n)
        cur_bytes += b
    shards.append(cur)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in shard}, path / fname, meta)
        weight_map.update({n: fname for n in shard})
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
