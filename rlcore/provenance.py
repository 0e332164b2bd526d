"""Where a run's numbers come from: θ0's hash, the dataset's, the code and library versions, the
device and threads, the host. The trainer hands this record to its sink before it logs anything,
so every metrics file, run page and API answer carries it, and a comparison can tell when the
runs it aggregates started from different θ0 or ran different code."""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from rlcore import models, tasks
from rlcore.config import RunConfig

REPO = Path(__file__).resolve().parents[1]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """The commit of the checkout rlcore runs from, when it is a git checkout."""
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def record(config: RunConfig, initial: torch.nn.Module, device: torch.device) -> dict[str, Any]:
    """The provenance of a run of `config` that starts from θ0 = `initial` on `device`."""
    found = tasks.dataset_sha256s(config.task)
    datasets = {}
    if config.task.name == "jsonl":
        datasets["dataset_sha256"] = found[config.task.path]
        if config.task.eval_path:
            datasets["eval_dataset_sha256"] = found[config.task.eval_path]
    return {
        "theta0_sha256": models.weights_sha256(initial),
        **datasets,
        "rlcore_version": _version("off-policy-lab"),
        "git_commit": git_commit(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "vllm": _version("vllm"),
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "host": platform.node(),
    }
