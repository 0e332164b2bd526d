"""Versioned policy weights in a folder every worker reads: the trainer publishes version v
once, rollout workers load it by version.

A version is one immutable safetensors file, written through a temporary file and a rename
(a reader never sees half a file, whatever happens to the writing process), with its sha256
returned to the publisher, who records it; a loader checks the bytes against it, which also
catches a file damaged any other way. Publishing a version again replaces its file
atomically (a trainer resumed from a checkpoint republishes what it needs).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor


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
        from safetensors.torch import save_file

        started = time.perf_counter()
        target = self.path(version)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        # Copies: tied tensors (embeddings and head) must not share storage in the file.
        save_file({name: t.detach().to("cpu", copy=True).contiguous() for name, t in weights.items()}, tmp)
        with tmp.open("rb") as f:
            sha256 = hashlib.file_digest(f, "sha256").hexdigest()
        size = tmp.stat().st_size
        tmp.replace(target)
        return Published(version, target, sha256, size, time.perf_counter() - started)

    def load(self, version: int, sha256: str) -> dict[str, Tensor]:
        from safetensors.torch import load

        data = self.path(version).read_bytes()
        if hashlib.sha256(data).hexdigest() != sha256:
            raise ValueError(
                f"weights of version {version} at {self.path(version)} do not match their sha256"
            )
        return load(data)

    def prune(self, keep: set[int]) -> None:
        """Delete every version file not in `keep`."""
        for path in self.root.glob("v*.safetensors"):
            if int(path.stem[1:]) not in keep:
                path.unlink(missing_ok=True)
