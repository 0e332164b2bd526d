"""The Hugging Face Trainer's `trainer_state.json` (TRL's trainers among them), saved with each
checkpoint: `log_history` is a list of entries, each `{"step": N, "epoch": e, metric: value}`.
Its entries keep no wall-clock time: every point's time is None. The state's other scalar fields
(max_steps, train_batch_size, …) are the run's config."""

from __future__ import annotations

from pathlib import Path

from . import common
from .base import ImportFormatError, ParsedRun, Point

TOOL = "trl"

# TRL's GRPO names (trl/trainer/grpo_trainer.py) and the Trainer's own → the lab's. TRL's `kl` is
# the k3 estimate against the reference model, the initial one by default; its
# `sampling/sampling_logp_difference/mean` is the mean |trainer − engine| log-prob.
MAPPING = {
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "lr",
    "reward": "reward/mean",
    "reward_std": "reward/std",
    "entropy": "entropy",
    "kl": "kl/init_k3",
    "clip_ratio/region_mean": "clip_frac",
    "completions/mean_length": "response_length/mean",
    "sampling/sampling_logp_difference/mean": "mismatch/drift_abs_mean",
    "eval_reward": "eval/reward",
}


def rewritten(mapping: dict[str, str]) -> dict[str, str]:
    """The mapping under the names the Trainer gives W&B, TensorBoard and Trackio
    (`transformers.integrations.rewrite_logs`: `eval_x` → `eval/x`, others → `train/x`)."""
    return {
        (f"eval/{name[5:]}" if name.startswith("eval_") else f"train/{name}"): lab
        for name, lab in mapping.items()
    }


def read(path: Path, max_bytes: int = common.MAX_BYTES) -> ParsedRun:
    state = common.json_object(path, None, common.text(path, max_bytes))
    history = state.get("log_history")
    if not isinstance(history, list):
        raise ImportFormatError(path, None, 'expected a trainer state with a "log_history" list')
    points = []
    for index, entry in enumerate(history):
        where = f"log_history entry {index}"
        if not isinstance(entry, dict):
            raise ImportFormatError(path, where, f"expected an object, got {type(entry).__name__}")
        step = common.step(path, where, entry.get("step"))
        values = {key: value for key, value in entry.items() if key != "step"}
        points.extend(Point(step, name, value, None) for name, value in common.numbers(values))
    config = {key: value for key, value in state.items() if isinstance(value, (int, float, str, bool))}
    return ParsedRun(tool=TOOL, config=config, points=common.unique(path, points))
