"""Versioned policy weights in a folder every worker reads: the trainer publishes version v as one
immutable safetensors file (written through a rename, hashed as written), rollout workers load it
by version and check it against the sha256 the publisher recorded."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

# The safetensors dtype names (https://github.com/huggingface/safetensors, format: an 8-byte
# little-endian header length, a JSON header, the tensors' bytes).
DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def write_safetensors(path: Path, tensors: dict[str, Tensor]) -> tuple[str, int]:
    """Write `tensors` to `path` in the safetensors format; return (sha256 of the file, its size).

    Each tensor's bytes go from memory to the file as they are (no serialised copy), hashed on
    the way; tensors that share storage (tied embeddings) are written apart."""
    header: dict[str, dict] = {}
    chunks = []
    offset = 0
    for name, tensor in tensors.items():
        tensor = tensor.detach().to("cpu").contiguous()
        if tensor.dtype not in DTYPES:
            raise ValueError(f"tensor {name!r}: dtype {tensor.dtype} cannot be published")
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        if size:
            chunks.append(tensor.reshape(-1).view(torch.uint8).numpy())
        offset += size
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the format pads the header with spaces to 8 bytes
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for chunk in (struct.pack("<Q", len(head)), head, *chunks):
            f.write(chunk)
            digest.update(chunk)
    return digest.hexdigest(), 8 + len(head) + offset


NAMES = {name: dtype for dtype, name in DTYPES.items()}


def read_safetensors(data: bytearray) -> dict[str, Tensor]:
    """The tensors of a safetensors file's bytes, as views of `data` where their offset suits
    their dtype (a copy otherwise, and for empty tensors)."""
    (head_len,) = struct.unpack_from("<Q", data)
    header = json.loads(bytes(data[8 : 8 + head_len]))
    start = 8 + head_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in NAMES:
            raise ValueError(f"tensor {name!r}: dtype {info['dtype']} is not one this store writes")
        dtype = NAMES[info["dtype"]]
        lo, hi = info["data_offsets"]
        size = torch.empty((), dtype=dtype).element_size()
        if hi == lo:
            tensors[name] = torch.empty(info["shape"], dtype=dtype)
            continue
        tensor = torch.frombuffer(data, dtype=dtype, count=(hi - lo) // size, offset=start + lo)
        if (start + lo) % size:
            tensor = tensor.clone()
        tensors[name] = tensor.reshape(info["shape"])
    return tensors


@dataclass(frozen=True)
class Published:
    version: int
    path: Path
    sha256: str
    size_bytes: int
    seconds: float  # time to serialise and write


class WeightStore:
    """`<root>/v000012.safetensors` for version 12."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, version: int) -> Path:
        return self.root / f"v{version:06d}.safetensors"

    def publish(self, version: int, weights: dict[str, Tensor]) -> Published:
        started = time.perf_counter()
        target = self.path(version)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        sha256, size = write_safetensors(tmp, weights)
        tmp.replace(target)
        return Published(version, target, sha256, size, time.perf_counter() - started)

    def load(self, version: int, sha256: str) -> dict[str, Tensor]:
        """The tensors of `version`, read once into one buffer, hashed there and viewed in place
        (no copy per tensor: a loader copies them into its model anyway); ValueError when the
        file is not the bytes `sha256` names."""
        path = self.path(version)
        with open(path, "rb") as f:
            data = bytearray(os.fstat(f.fileno()).st_size)
            f.readinto(data)
        if hashlib.sha256(data).hexdigest() != sha256:
            raise ValueError(f"weights of version {version} at {path} do not match their sha256")
        return read_safetensors(data)

    def versions(self) -> list[int]:
        """The versions that have a file here."""
        return [int(path.stem[1:]) for path in self.root.glob("v*.safetensors")]

    def remove(self, versions: set[int]) -> None:
        """Delete these versions' files."""
        for version in versions:
            self.path(version).unlink(missing_ok=True)
