"""A run's trainer in several processes (`execution.train_processes`, `rlcore.distributed`): real
torchrun ranks on gloo, one thread each, against one process: the same §7 metrics at every step,
the same final weights, shards that really split the memory, a resume from a sharded checkpoint
that logs the uninterrupted curve, a checkpoint refused by another number of ranks, and a held-out
evaluation split across ranks whose responses end at different lengths."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from pydantic import ValidationError

from rlcore import checkpoints, distributed, launch, trainer
from rlcore.config import error_list
from rlcore.sinks import ListSink
from tests.rlcore.rlcore_helpers import SMALL, TIMING, assert_trained, merge, without_timing

ROOT = Path(__file__).resolve().parents[2]
TARGET = Path(__file__).resolve().with_name("ranks_target.py")
EVAL_TARGET = TARGET.with_name("eval_target.py")
RANK_ENV = {"LAB_RANK_TIMEOUT_S": "120"}  # a rank stuck in a collective fails the test, not hangs it
PARITY = merge(SMALL, {"steps": 8, "eval_every": 4, "checkpoint_every": 8, "algorithm": {"preset": "grpo"}})


def write_config(tmp_path: Path, data: dict, processes: int) -> Path:
    path = tmp_path / f"run-{processes}.yaml"
    path.write_text(yaml.safe_dump(merge(data, {"execution": {"train_processes": processes}})))
    return path


def finish(proc: subprocess.Popen, timeout: float = 900) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        launch.stop_ranks(proc)
        raise
    assert proc.returncode == 0, out[-12000:]
    return out


def run_target(
    tmp_path: Path, config: Path, name: str, cache_dir: Path, target: Path = TARGET, **flags
) -> dict:
    """The ranks of `config` under torchrun through the test `target`; rank 0's report."""
    out = tmp_path / f"{name}.json"
    command = launch.rank_command([target, config, out, "--cache-dir", cache_dir], 2)
    for flag, value in flags.items():
        command += [f"--{flag.replace('_', '-')}", str(value)]
    env = {**os.environ, **RANK_ENV, "OMP_NUM_THREADS": "1", "LAB_RANK_THREADS": "1"}
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    finish(proc)
    report = json.loads(out.read_text())
    if "points" in report:
        report["points"] = [(step, metrics) for step, metrics in report["points"]]
    return report


def read_jsonl(path: Path) -> tuple[list, list]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    points = [(row["step"], row["metrics"]) for row in rows if "metrics" in row]
    return points, [row["provenance"] for row in rows if "provenance" in row]


def assert_same_curve(one: list, ranks: list) -> None:
    """Every metric of every step within 1e-5 (timings aside), nothing missing or logged twice, of
    runs that learned (`assert_trained`)."""
    assert [step for step, _ in ranks] == [step for step, _ in one]
    assert_trained(one)
    for (step, a), (_, b) in zip(one, ranks, strict=True):
        assert set(a) == set(b), step
        for name in set(a) - TIMING:
            assert math.isclose(a[name], b[name], rel_tol=1e-5, abs_tol=1e-5), (step, name, a[name], b[name])


def final_weights(checkpoint_dir: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """The policy in the newest checkpoint there, one process's (`.pt`) or the ranks' (`.dcp`)."""
    single = checkpoints.existing(checkpoint_dir)
    if single:
        return torch.load(single[0][1], weights_only=True)["policy"]
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = tmp_path / "from-dcp.pt"
    dcp_to_torch_save(checkpoints.existing_sharded(checkpoint_dir)[0][1], whole)
    return torch.load(whole, weights_only=True)["model"]


def one_process(data: dict, cache_dir: Path, checkpoint_dir: Path) -> list:
    sink = ListSink()
    config = trainer.RunConfig.model_validate(data)
    trainer.train(config, sink, cache_dir=cache_dir, checkpoint_dir=checkpoint_dir)
    return sink.points


def test_two_ranks_log_one_process_s_curve_and_end_at_its_weights(cache_dir, tmp_path):
    """Through the command line: `python -m rlcore run` starts the ranks itself."""
    config = write_config(tmp_path, PARITY, 2)
    cli = subprocess.Popen(
        [sys.executable, "-m", "rlcore", "run", str(config), "--out", str(tmp_path / "ranks.jsonl"),
         "--checkpoint-dir", str(tmp_path / "ranks"), "--cache-dir", str(cache_dir)],
        cwd=ROOT, env={**os.environ, **RANK_ENV}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    finish(cli)
    ranks, records = read_jsonl(tmp_path / "ranks.jsonl")
    one = one_process(PARITY, cache_dir, tmp_path / "one")
    assert_same_curve(one, ranks)
    assert one[-1][1]["kl/init"] > 1e-4, "it trained"
    assert len(records) == 1 and records[0]["train_processes"] == 2 and records[0]["backend"] == "gloo"
    assert records[0]["threads_per_rank"] == launch.threads_per_rank(2)
    mine, theirs = final_weights(tmp_path / "one", tmp_path), final_weights(tmp_path / "ranks", tmp_path)
    assert set(mine) - {"lm_head.weight"} <= set(theirs)  # tied to the embeddings
    assert max(float((mine[k] - theirs[k]).abs().max()) for k in mine if k in theirs) <= 1e-6


@pytest.mark.parametrize(
    "change",
    [
        {"optimizer": {"minibatches": 2}, "algorithm": {"params": {"anchor": "proximal"}}},
        {"algorithm": {"preset": "m2po", "params": {"m2po_tau": 1e-4}}, "staleness": {"sync_offset": 4}},
        # Each rank's rows carry their own lags (0, 1, then 2: α = ½).
        {
            "optimizer": {"minibatches": 2},
            "algorithm": {"params": {"anchor": "loglinear"}},
            "staleness": {"sync_offset": 2},
        },
    ],
    ids=["minibatches-proximal", "m2po", "minibatches-loglinear"],
)
def test_two_ranks_match_one_process_with_several_optimiser_steps_and_whole_batch_masks(
    cache_dir, tmp_path, change
):
    data = merge(PARITY, change)
    ranks = run_target(
        tmp_path, write_config(tmp_path, data, 2), "ranks", cache_dir, checkpoint_dir=tmp_path / "r"
    )
    one = one_process(data, cache_dir, tmp_path / "one")
    assert_same_curve(one, ranks["points"])
    if "minibatches" in change.get("optimizer", {}):
        assert all(m["optimizer_steps"] == 2 for step, m in one if step)
        assert max(m["kl/proximal"] for step, m in one if step) > 0
        if change["algorithm"]["params"]["anchor"] == "loglinear":
            assert all(m["time/proximal_s"] == 0 for step, m in one if step)
    else:
        assert max(m["correction/masked_frac"] for step, m in one if step) > 0, "M2PO masked tokens"
    mine, theirs = final_weights(tmp_path / "one", tmp_path), final_weights(tmp_path / "r", tmp_path)
    assert max(float((mine[k] - theirs[k]).abs().max()) for k in mine if k in theirs) <= 1e-6


def test_each_rank_holds_about_half_of_the_parameters_and_optimiser_state(cache_dir, tmp_path):
    data = merge(PARITY, {"steps": 1, "eval_every": 0, "checkpoint_every": 0})
    ranks = run_target(tmp_path, write_config(tmp_path, data, 2), "held", cache_dir)
    learner = trainer.prepare(trainer.RunConfig.model_validate(data), cache_dir)
    trainer.run_step(learner, trainer.local_source(learner, cache_dir), 1)
    whole = distributed.held_bytes(learner)
    assert len(ranks["held"]) == 2
    assert all(0 < held <= 0.6 * whole for held in ranks["held"]), (ranks["held"], whole)


def test_a_resume_from_a_sharded_checkpoint_logs_the_uninterrupted_curve(cache_dir, tmp_path):
    # The default learning rate: at 1e-3 every reward is 0 from step 5 on, the compared steps.
    data = merge(PARITY, {"checkpoint_every": 2, "staleness": {"sync_offset": 2}})
    config = write_config(tmp_path, data, 2)
    whole = run_target(tmp_path, config, "whole", cache_dir, checkpoint_dir=tmp_path / "whole")
    split = tmp_path / "split"
    first = run_target(tmp_path, config, "first", cache_dir, checkpoint_dir=split, stop_after=5)
    assert first["summary"]["steps"] == 5 and first["summary"]["completed"] == 0
    assert sorted(p.name for _, p in checkpoints.existing_sharded(split)) == [
        "step-000002.dcp",
        "step-000004.dcp",
    ]
    resumed = run_target(tmp_path, config, "resumed", cache_dir, checkpoint_dir=split)
    assert [step for step, _ in resumed["points"]] == [5, 6, 7, 8]
    assert without_timing(resumed["points"]) == without_timing(whole["points"])[5:]
    assert_trained(resumed["points"])
    assert resumed["summary"]["completed"] == 1


def test_ranks_whose_evaluation_responses_end_at_different_lengths_give_one_process_s_numbers(
    cache_dir, tmp_path
):
    """The held-out evaluation split across 2 ranks, rank 0's problems all ending at EOS at once
    and rank 1's running to max_new_tokens: neither waits on the other (no collective inside
    generation) and the sums add up to one process's evaluation."""
    from tests.rlcore import eval_target

    data = merge(PARITY, {"eval_size": 8})
    report = run_target(tmp_path, write_config(tmp_path, data, 2), "eval", cache_dir, target=EVAL_TARGET)
    config = trainer.RunConfig.model_validate(data)
    learner = trainer.prepare(config, cache_dir)
    eval_target.ends_by_half(learner)
    one = learner.evaluator.evaluate(learner.policy, eval_target.STEP)
    assert report["tokens"] == [4, 4 * config.rollout.max_new_tokens]  # 1 token each; the longest
    assert set(report["metrics"]) == set(one)
    for name, value in one.items():
        assert math.isclose(report["metrics"][name], value, rel_tol=1e-6, abs_tol=1e-6), name
    assert one["eval/kl_init"] > 0


def test_a_sharded_checkpoint_is_refused_by_another_number_of_ranks(cache_dir, tmp_path):
    data = merge(PARITY, {"steps": 2, "eval_every": 0, "checkpoint_every": 2})
    run_target(tmp_path, write_config(tmp_path, data, 2), "two", cache_dir, checkpoint_dir=tmp_path / "c")
    ledger = checkpoints.FileLedger(tmp_path / "c")
    learner = trainer.prepare(
        trainer.RunConfig.model_validate(merge(data, {"execution": {"train_processes": 4}})), cache_dir
    )
    with pytest.raises(
        checkpoints.CheckpointError, match="written by 2 trainer processes and this attempt has 4"
    ):
        distributed._choose(tmp_path / "c", ledger, learner, None, ListSink(), distributed.Ranks(0, 4))
    with pytest.raises(checkpoints.CheckpointError, match="written by several trainer processes"):
        trainer.train(
            trainer.RunConfig.model_validate(data),
            ListSink(),
            cache_dir=cache_dir,
            checkpoint_dir=tmp_path / "c",
        )


def test_the_ranks_run_in_a_process_group_of_their_own_that_stop_ranks_ends(cache_dir, tmp_path):
    config = write_config(tmp_path, merge(PARITY, {"steps": 50}), 2)
    proc = launch.start_ranks(launch.rlcore_rank(config, cache_dir=cache_dir), 2, threads=1, cwd=ROOT, env=RANK_ENV,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    assert os.getpgid(proc.pid) == proc.pid
    launch.stop_ranks(proc, grace_s=10)
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)


@pytest.mark.parametrize(
    ("data", "rule"),
    [
        ({"execution": {"train_processes": 0}}, "greater than or equal to 1"),
        ({"execution": {"train_processes": 65}}, "less than or equal to 64"),
        (
            {
                "execution": {"train_processes": 3},
                "optimizer": {"minibatches": 2},
                "rollout": {"prompts_per_step": 4},
            },
            "execution.train_processes (3) must be <= rollout.prompts_per_step ÷ optimizer.minibatches",
        ),
    ],
)
def test_train_processes_out_of_bounds_is_refused_naming_the_field(data, rule):
    with pytest.raises(ValidationError) as caught:
        trainer.RunConfig.model_validate(data)
    assert any(
        name == "execution.train_processes" and rule in message for name, message in error_list(caught.value)
    )
