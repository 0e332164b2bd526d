"""The HF Trainer's trainer_state.json, written by transformers' own `TrainerState.save_to_json`,
read back point by point (its log entries keep no time)."""

from __future__ import annotations

import math

import pytest
from transformers import TrainerState

from imports.formats import DEFAULT_MAPPINGS, ImportFormatError, Point, map_points, read

LOG_HISTORY = [
    {
        "step": 1,
        "epoch": 0.5,
        "loss": 0.75,
        "grad_norm": 1.5,
        "learning_rate": 1e-06,
        "reward": 0.25,
        "kl": 0.0,
    },
    {"step": 2, "epoch": 1.0, "loss": 0.5, "grad_norm": float("nan"), "learning_rate": 2e-06, "reward": 0.5},
    {"step": 2, "epoch": 1.0, "eval_reward": 0.375, "eval_runtime": 3.25},
    {"step": 2, "epoch": 1.0, "train_runtime": 12.5, "train_loss": 0.625, "total_flos": 0.0},
]


def test_every_logged_value_is_read_point_by_point(tmp_path):
    state = TrainerState(global_step=2, max_steps=2, logging_steps=1, log_history=LOG_HISTORY)
    path = tmp_path / "trainer_state.json"
    state.save_to_json(str(path))
    run = read("trl", path)
    expected = [
        Point(entry["step"], name, value, None)
        for entry in LOG_HISTORY
        for name, value in entry.items()
        if name != "step"
    ]
    expected.remove(Point(2, "epoch", 1.0, None))  # logged three times at step 2: one point
    expected.remove(Point(2, "epoch", 1.0, None))
    by_key = {(p.step, p.name): p.value for p in run.points}
    assert len(run.points) == len(expected)
    for point in expected:
        value = by_key[(point.step, point.name)]
        assert value == point.value or (math.isnan(value) and math.isnan(point.value)), point
    assert run.config["global_step"] == 2 and run.config["max_steps"] == 2
    lab = {(p.step, p.name): p.value for p in map_points(run.points, DEFAULT_MAPPINGS["trl"])}
    assert lab[(1, "lr")] == 1e-06 and lab[(1, "reward/mean")] == 0.25 and lab[(2, "eval/reward")] == 0.375
    assert lab[(1, "kl/init_k3")] == 0.0 and lab[(2, "imported/train_runtime")] == 12.5


@pytest.mark.parametrize(
    ("content", "where", "rule"),
    [
        (b'{"global_step": 2, "log_history": [{"step": 1, "loss": 0.5}, {"st', None, "not JSON"),
        (b'{"global_step": 2}', None, '"log_history" list'),
        (
            b'{"log_history": [{"step": 1, "loss": 0.5}, {"loss": 0.25}]}',
            "log_history entry 1",
            "step must be",
        ),
        (
            b'{"log_history": [{"step": 1, "loss": 0.5}, 7]}',
            "log_history entry 1",
            "expected an object, got int",
        ),
        (b'{"log_history": []}', None, "holds no metric values"),
        (b"PK\x03\x04\x00\x00binary", "line 1", "binary data"),
    ],
)
def test_a_bad_state_is_refused_naming_the_entry_and_the_rule(tmp_path, content, where, rule):
    path = tmp_path / "trainer_state.json"
    path.write_bytes(content)
    with pytest.raises(ImportFormatError) as error:
        read("trl", path)
    assert error.value.where == where and rule in error.value.rule


def test_a_state_over_the_cap_is_refused(tmp_path):
    path = tmp_path / "trainer_state.json"
    TrainerState(log_history=LOG_HISTORY).save_to_json(str(path))
    with pytest.raises(ImportFormatError, match="an import reads at most 64 bytes"):
        read("trl", path, max_bytes=64)
