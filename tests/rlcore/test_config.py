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
            "staleness settings do not apply to execution mode 'async'",
        ),
        (
            {"execution": {"mode": "distributed"}, "rollout": {"engine": "vllm"}, "device": "cpu"},
            "device",
            "the rollout-gpu queue",
        ),
        (
            {"execution": {"init_logprobs": "elsewhere"}},
            "execution.init_logprobs",
            "Input should be 'trainer', 'rollout' or 'auto'",
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


JSONL = {"name": "jsonl", "path": "data/train.jsonl"}


@pytest.mark.parametrize(
    "template,words",
    [
        ("{question}{question:>1000000000}", "{question:>1000000000} has a format spec (:>1000000000)"),
        ("{question!r}", "{question!r} has a conversion (!r)"),
        ("{question.__class__}", "{question.__class__} must be a plain {name}"),
        ("{question[0]}", "{question[0]} must be a plain {name}"),
        ("{question} {0}", "{0} must be a plain {name}"),
        ("{question} {}", "{} must be a plain {name}"),
        ("{question", "not a valid template"),
        ("{{question}}", "must contain {question}"),
        ("{question}" * 500, "at most 4096 characters"),
    ],
)
def test_prompt_templates_allow_named_fields_only(template, words):
    errors = errors_of({"task": {**JSONL, "prompt_template": template}})
    assert words in errors["task.prompt_template"], errors


def test_a_template_may_name_other_fields_and_escape_braces():
    config = RunConfig.model_validate({"task": {**JSONL, "prompt_template": "{{x}} {topic}: {question}\n"}})
    assert config.task.prompt_template == "{{x}} {topic}: {question}\n"


@pytest.mark.parametrize(
    "data,field,words",
    [
        (
            {"rollout": {"prompts_per_step": 4096, "group_size": 4}},
            "rollout.prompts_per_step",
            "(4096 × 4 = 16,384 responses per step) must be <= 8,192",
        ),
        (
            {"rollout": {"prompts_per_step": 512, "group_size": 16, "max_new_tokens": 256}},
            "rollout.max_new_tokens",
            "(512 × 16 × 256 = 2,097,152 new tokens per step) must be <= 1,048,576",
        ),
        (
            {"rollout": {"prompts_per_step": 8, "max_new_tokens": 8192}, "eval_size": 200},
            "eval_size",
            "eval_size × rollout.max_new_tokens (200 × 8192 = 1,638,400 new tokens per evaluation)",
        ),
        (
            {"rollout": {"prompts_per_step": 8, "max_new_tokens": 8192}, "eval_size": 100},
            "task.held_out",
            "task.held_out × rollout.max_new_tokens (200 × 8192 = 1,638,400 new tokens per warm-start check",
        ),
        (
            {"rollout": {"max_new_tokens": 1024}, "staleness": {"sync_offset": 300}},
            "staleness.sync_offset",
            "(300 × 131,072 = 39,321,600 tokens of batches generated ahead) must be <= 33,554,432",
        ),
        (
            {"rollout": {"max_new_tokens": 1024}, "execution": {"mode": "async", "max_staleness": 300}},
            "execution.max_staleness",
            "execution.max_staleness × new tokens per step (300 × 131,072",
        ),
        (
            {"task": {"name": "arithmetic", "operators": ["+", "+"]}},
            "task.operators",
            "list each operator once",
        ),
        (
            {"task": {"name": "arithmetic", "held_out": 10_001}},
            "task.held_out",
            "less than or equal to 10000",
        ),
        ({"eval_size": 10_001}, "eval_size", "less than or equal to 10000"),
        ({"model": {"tiny": {"hidden_size": 1024}}}, "model.tiny.hidden_size", "less than or equal to 512"),
        ({"model": {"tiny": {"num_layers": 9}}}, "model.tiny.num_layers", "less than or equal to 8"),
        ({"model": {"tiny": {"intermediate_size": 4096}}}, "model.tiny.intermediate_size", "<= 2048"),
        ({"model": {"tiny": {"warmstart_max_steps": 20_001}}}, "model.tiny.warmstart_max_steps", "20000"),
        (
            {"optimizer": {"micro_batch_size": 8193}},
            "optimizer.micro_batch_size",
            "less than or equal to 8192",
        ),
        ({"task": {"name": "arithmetic", "split_seed": 2**31}}, "task.split_seed", "less than 2147483648"),
        ({"task": {**JSONL, "question_field": "q" * 201}}, "task.question_field", "at most 200 characters"),
    ],
)
def test_the_run_budget_names_the_field_and_the_rule(data, field, words):
    errors = errors_of(data)
    assert field in errors, errors
    assert words in errors[field] or words.replace("<=", "less than or equal to") in errors[field], errors


def test_the_examples_fit_the_budget():
    from pathlib import Path

    examples = Path(__file__).resolve().parents[2] / "examples"
    for path in sorted(examples.glob("*.yaml")):
        load(path)


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
    assert (distributed.rollout_queue, distributed.staleness_label) == (
        "rollout",
        "sync_offset=2 (distributed)",
    )
    async_run = RunConfig.model_validate({"execution": {"mode": "async"}})
    assert async_run.execution.max_staleness == 1, "async defaults to one version behind at most"
    assert async_run.staleness_label == "async ≤ 1"
    gpu = RunConfig.model_validate({"execution": {"mode": "async"}, "rollout": {"engine": "vllm"}})
    assert (gpu.queue, gpu.rollout_queue) == ("gpu", "rollout-gpu")
    # Stored resolved: the stored form validates to the same config.
    assert RunConfig.model_validate(async_run.model_dump(mode="json")) == async_run
