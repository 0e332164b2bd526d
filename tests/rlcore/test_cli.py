"""`python -m rlcore`: the example run learns, the staleness variants log the right lag."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from rlcore import models, presets
from rlcore.staleness import staleness

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "arithmetic.yaml"


def rlcore(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "rlcore", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_metrics(path):
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    return {row["step"]: row["metrics"] for row in rows if "metrics" in row}


def test_presets_and_schema_commands():
    out = rlcore("presets")
    assert out.returncode == 0
    # By family: a family's line, then per preset its name and line, and the knobs its loss reads.
    lines = out.stdout.splitlines()
    listed = [line.split()[0] for line in lines if line.startswith("  ") and not line.startswith("   ")]
    assert sorted(listed) == sorted(presets.PRESETS)
    assert [line for line in lines if not line.startswith(" ")] == list(presets.families())
    knobs = next(lines[i + 1] for i, line in enumerate(lines) if line.split()[:1] == ["m2po"])
    assert "m2po_tau=0.04" in knobs and "eps_low" not in knobs
    schema = json.loads(rlcore("schema").stdout)
    assert "staleness" in schema["properties"]


def test_example_run_raises_eval_accuracy_by_ten_points(cache_dir, tmp_path):
    out_file = tmp_path / "metrics.jsonl"
    out = rlcore("run", EXAMPLE, "--out", out_file, "--cache-dir", cache_dir)
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = read_metrics(out_file)
    assert sorted(metrics) == list(range(101))
    gain = metrics[100]["eval/accuracy"] - metrics[0]["eval/accuracy"]
    assert gain >= 0.10, f"eval/accuracy {metrics[0]['eval/accuracy']} -> {metrics[100]['eval/accuracy']}"
    assert "eval/accuracy" in out.stdout and "rec-oneside-nois | on-policy" in out.stdout
    assert all(m["staleness"] == 0 for step, m in metrics.items() if step)
    first = json.loads(out_file.read_text().splitlines()[0])
    record = first["provenance"]
    shipped = next(models.SHIPPED.glob("tiny-*/theta0.sha256")).read_text().strip()
    assert record["theta0_sha256"] == shipped, "the example starts from the shipped θ0"
    assert record["torch"] == torch.__version__ and record["device"] == "cpu" and record["torch_threads"] >= 1
    assert {"rlcore_version", "git_commit", "transformers", "vllm", "host"} <= set(record)


@pytest.mark.parametrize(
    "change,schedule",
    [
        ({"sync_interval": 8}, (8, 0, False)),
        ({"sync_offset": 4}, (1, 4, False)),
        ({"offline": True}, (1, 0, True)),
    ],
)
def test_example_staleness_variants_log_the_right_lag(cache_dir, tmp_path, change, schedule):
    config = yaml.safe_load(EXAMPLE.read_text())
    config["staleness"].update(change)
    config.update(steps=10, eval_every=0, eval_size=20)
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(config))
    out = rlcore("run", path, "--out", tmp_path / "m.jsonl", "--cache-dir", cache_dir)
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = read_metrics(tmp_path / "m.jsonl")
    logged = [metrics[t]["staleness"] for t in range(1, 11)]
    assert logged == [staleness(t, *schedule) for t in range(1, 11)]
    assert max(logged) > 0


def test_bad_config_file_exits_2_naming_the_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rollout:\n  group_size: 1\n")
    out = rlcore("run", path)
    assert out.returncode == 2
    assert "rollout.group_size" in out.stderr and str(path) in out.stderr


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            "algorithm:\n  preset: grpo-tis\n  params:\n    is_cap: 0.5\n",
            "algorithm.params: is_cap must be >= 1",
        ),
        ("algorithm:\n  preset: sapo\n  params:\n    sapo_tau_neg: 0\n", "sapo_tau_neg must be > 0"),
        ("optimizer:\n  minibatches: 99\n", "optimizer.minibatches: optimizer.minibatches (99) must be <="),
        ("optimizer:\n  epochs: 9\n", "optimizer.epochs"),
        ("rollout:\n  dtype: float8\n", "rollout.dtype"),
    ],
)
def test_the_field_losses_knobs_out_of_range_exit_2_naming_the_field(tmp_path, text, shown):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    out = rlcore("run", path)
    assert out.returncode == 2 and shown in out.stderr, out.stderr


def test_missing_dataset_exits_1_naming_the_file(tmp_path):
    path = tmp_path / "run.yaml"
    missing = tmp_path / "nope.jsonl"
    path.write_text(f"task:\n  name: jsonl\n  path: {missing}\nsteps: 2\n")
    out = rlcore("run", path)
    assert out.returncode == 1
    assert f"error: {missing}: no such file" in out.stderr
