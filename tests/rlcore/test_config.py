"""RunConfig: one schema, errors that name the field and the rule, presets stored resolved."""

import json

import pytest
from pydantic import ValidationError

from rlcore.config import MAX_STEPS, RunConfig, error_list, load


def errors_of(data, **context):
    with pytest.raises(ValidationError) as err:
        RunConfig.model_validate(data, context=context or None)
    return dict(error_list(err.value))


@pytest.mark.parametrize(
    "data,field,words",
    [
        ({"algorithm": {"preset": "ppo9"}}, "algorithm.preset", "unknown preset 'ppo9'"),
        (
            {"algorithm": {"preset": "grpo", "params": {"clip": 1}}},
            "algorithm.params",
            "unknown algorithm parameter",
        ),
        (
            {"algorithm": {"preset": "grpo", "params": {"eps_high": 0}}},
            "algorithm.params",
            "eps_high must be > 0",
        ),
        ({"rollout": {"group_size": 1}}, "rollout.group_size", "greater than or equal to 2"),
        ({"optimizer": {"lr": -0.1}}, "optimizer.lr", "greater than 0"),
        ({"steps": MAX_STEPS + 1}, "steps", f"less than or equal to {MAX_STEPS}"),
        ({"staleness": {"sync_interval": 0}}, "staleness.sync_interval", "greater than or equal to 1"),
        ({"rollout": {"temperature": 0}}, "rollout.temperature", "greater than 0"),
        ({"task": {"name": "arithmetic", "min_operand": 50, "max_operand": 20}}, "task", "min_operand (50)"),
        ({"model": {"source": "local"}}, "model", "path is required"),
        ({"model": {"tiny": {"hidden_size": 30, "num_heads": 4}}}, "model.tiny", "divisible by num_heads"),
        ({"eval_size": 500}, "config", "eval_size (500) must be <= task.held_out (200)"),
        ({"rollout": {"engine": "vllm"}, "device": "cpu"}, "device", "cannot run rollout.engine 'vllm'"),
        ({"bogus": 1}, "bogus", "Extra inputs are not permitted"),
        (
            {"execution": {"mode": "distributed", "max_staleness": 2}},
            "execution.max_staleness",
            "max_staleness applies to mode 'async' only",
        ),
        (
            {"execution": {"rollout_workers": 2}},
            "execution.rollout_workers",
            "needs mode 'distributed' or 'async'",
        ),
        (
            {"execution": {"mode": "distributed", "rollout_workers": 17}},
            "execution.rollout_workers",
            "less than or equal to 16",
        ),
        (
            {"execution": {"mode": "distributed", "rollout_workers": 5}, "rollout": {"prompts_per_step": 4}},
            "execution",
            "execution.rollout_workers (5) must be <= rollout.prompts_per_step (4)",
        ),
        (
            {"execution": {"mode": "async"}, "staleness": {"sync_offset": 2}},
            "execution",
            "staleness settings do not apply to mode 'async'",
        ),
        (
            {"execution": {"mode": "distributed"}, "rollout": {"engine": "vllm"}, "device": "cpu"},
            "device",
            "the rollout-gpu queue",
        ),
        (
            {"execution": {"mode": "async", "max_staleness": -1}},
            "execution.max_staleness",
            "greater than or equal to 0",
        ),
    ],
)
def test_errors_name_the_field_and_the_rule(data, field, words):
    errors = errors_of(data)
    assert field in errors, errors
    assert words in errors[field]


def test_dataset_and_model_paths_must_lie_under_the_allowed_roots(tmp_path):
    inside = tmp_path / "data" / "train.jsonl"
    errors = errors_of(
        {"task": {"name": "jsonl", "path": "/etc/passwd"}}, data_roots=[str(tmp_path / "data")]
    )
    assert "outside the allowed roots" in errors["task.path"]
    ok = RunConfig.model_validate(
        {"task": {"name": "jsonl", "path": str(inside)}}, context={"data_roots": [str(tmp_path / "data")]}
    )
    assert ok.task.path == str(inside)
    escape = str(tmp_path / "data" / ".." / "secret.jsonl")
    assert "task.path" in errors_of(
        {"task": {"name": "jsonl", "path": escape}}, data_roots=[str(tmp_path / "data")]
    )
    errors = errors_of({"model": {"source": "local", "path": "/opt/x"}}, model_roots=[str(tmp_path)])
    assert "outside the allowed roots" in errors["model.path"]


def test_presets_are_stored_fully_resolved_and_round_trip():
    config = RunConfig.model_validate(
        {"algorithm": {"preset": "rec-oneside-nois-wide", "params": {"eps_low": 0.5}}}
    )
    assert config.algorithm.params["eps_low"] == 0.5
    assert config.algorithm.params["eps_high"] == 2.0
    assert set(config.algorithm.params) >= {"eps_low_prime", "reg_coef", "temp", "loss_agg", "dual_clip"}
    again = RunConfig.model_validate(json.loads(config.model_dump_json()))
    assert again == config


def test_labels_and_queue():
    assert RunConfig().staleness.label == "on-policy"
    assert RunConfig.model_validate({"staleness": {"sync_offset": 8}}).staleness.label == "sync_offset=8"
    both = RunConfig.model_validate({"staleness": {"sync_interval": 4, "sync_offset": 2}})
    assert both.staleness.label == "sync_interval=4,sync_offset=2"
    assert RunConfig.model_validate({"staleness": {"offline": True}}).staleness.label == "offline"
    assert RunConfig.model_validate({"device": "cpu"}).queue == "cpu"
    assert RunConfig.model_validate({"device": "cuda"}).queue == "gpu"
    assert RunConfig().batch_size == 16 * 8


def test_json_schema_is_available_for_forms():
    schema = RunConfig.model_json_schema()
    assert {"task", "model", "algorithm", "staleness", "rollout", "optimizer", "steps", "seed"} <= set(
        schema["properties"]
    )


def test_load_reports_the_file_and_every_bad_field(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("rollout:\n  group_size: 1\noptimizer:\n  lr: -1\n")
    with pytest.raises(ValueError) as err:
        load(path)
    message = str(err.value)
    assert str(path) in message and "rollout.group_size" in message and "optimizer.lr" in message
    path.write_text("steps: [1,\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load(path)
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="mapping of fields"):
        load(path)
    json_path = tmp_path / "run.json"
    json_path.write_text('{"steps": 3}')
    assert load(json_path).steps == 3


def test_execution_modes_pick_their_queues_and_labels():
    simulated = RunConfig()
    assert (simulated.execution.mode, simulated.queue, simulated.rollout_queue) == ("simulated", "cpu", None)
    distributed = RunConfig.model_validate(
        {"execution": {"mode": "distributed"}, "staleness": {"sync_offset": 2}}
    )
    assert (distributed.rollout_queue, distributed.staleness_label) == ("rollout", "sync_offset=2")
    async_run = RunConfig.model_validate({"execution": {"mode": "async"}})
    assert async_run.execution.max_staleness == 1, "async defaults to one version behind at most"
    assert async_run.staleness_label == "async,max_staleness=1"
    gpu = RunConfig.model_validate({"execution": {"mode": "async"}, "rollout": {"engine": "vllm"}})
    assert (gpu.queue, gpu.rollout_queue) == ("gpu", "rollout-gpu")
    # Stored resolved: the stored form validates to the same config.
    assert RunConfig.model_validate(async_run.model_dump(mode="json")) == async_run
