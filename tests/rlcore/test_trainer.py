"""The trainer: every metric every step (and named in docs/algorithms.md §7), determinism, resume, cancellation, divergence."""

import copy
import re
from pathlib import Path

import pytest
import torch

from rlcore import checkpoints, evaluate, models, tasks, trainer
from rlcore.sinks import ALL_METRICS, EVAL_METRICS, STEP_METRICS, ListSink
from tests.rlcore.rlcore_helpers import TIMING, assert_trained, without_timing


def test_every_metric_at_every_step_and_evals_on_schedule(small_config, cache_dir):
    sink = ListSink()
    summary = trainer.train(small_config(), sink, cache_dir=cache_dir)
    steps = [step for step, _ in sink.points]
    assert steps == [0, 1, 2, 3, 4, 5, 6]
    assert set(sink.points[0][1]) == set(EVAL_METRICS)
    for step, metrics in sink.points[1:]:
        assert set(STEP_METRICS) <= set(metrics), step
        assert (set(EVAL_METRICS) <= set(metrics)) == (step in (3, 6)), step
    assert summary["completed"] == 1.0 and summary["steps"] == 6
    assert summary["eval/accuracy"] == sink.points[-1][1]["eval/accuracy"]
    assert sink.points[0][1]["eval/kl_init"] == pytest.approx(0.0, abs=1e-6)
    first = sink.points[1][1]
    assert first["kl/init"] == pytest.approx(0.0, abs=1e-7), "step 1 trains θ0 itself"
    assert first["lr"] == pytest.approx(3e-5)
    assert first["entropy"] > 0 and 1 <= first["response_length/mean"] <= 6
    assert sink.points[-1][1]["kl/init"] > 0
    samples = [s for step, s in sink.samples if step == 1]
    assert len(samples) == 4 and all(isinstance(s.completion, str) and "=" in s.prompt for s in samples)


def test_same_config_and_seed_give_the_same_curve(small_config, cache_dir):
    runs = []
    for seed in (0, 0, 1):
        sink = ListSink()
        trainer.train(small_config(seed=seed, steps=4), sink, cache_dir=cache_dir)
        runs.append(without_timing(sink.points))
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    assert_trained(runs[0])


def test_same_prompts_for_every_preset_at_the_same_step(small_config, cache_dir):
    prompts = []
    for preset in ("reinforce", "grpo"):
        learner = trainer.prepare(small_config(algorithm={"preset": preset}), cache_dir)
        source = trainer.local_source(learner, cache_dir)
        steps = [trainer.run_step(learner, source, step)[0] for step in (1, 2, 3)]
        prompts.append([[p.prompt for p in batch.problems] for batch in steps])
    assert prompts[0] == prompts[1]


def test_resume_from_a_checkpoint_logs_what_an_uninterrupted_run_logs(small_config, cache_dir, tmp_path):
    # sync_offset=2 makes batches wait in the queue across the checkpoint.
    config = small_config(staleness={"sync_offset": 2}, optimizer={"lr": 1e-3})
    whole = ListSink()
    trainer.train(config, whole, cache_dir=cache_dir, checkpoint_dir=tmp_path / "whole")

    interrupted = ListSink(stop_after_step=3)
    summary = trainer.train(config, interrupted, cache_dir=cache_dir, checkpoint_dir=tmp_path / "split")
    assert summary["completed"] == 0.0 and summary["steps"] == 3
    assert [p.name for p in (tmp_path / "split").glob("step-*.pt")] == ["step-000002.pt"]

    resumed = ListSink()
    summary = trainer.train(config, resumed, cache_dir=cache_dir, checkpoint_dir=tmp_path / "split")
    assert [step for step, _ in resumed.points] == [3, 4, 5, 6]
    assert without_timing(resumed.points) == without_timing(whole.points)[3:]
    assert_trained(resumed.points)
    assert summary["completed"] == 1.0
    assert summary["eval/accuracy_initial"] == whole.points[0][1]["eval/accuracy"]


class FlushRecordingSink(ListSink):
    """Notes, at every flush, the last step logged and the checkpoints that exist."""

    def __init__(self, checkpoint_dir):
        super().__init__()
        self.checkpoint_dir = checkpoint_dir
        self.flushes = []

    def flush(self):
        last = self.points[-1][0]
        existing = sorted(p.name for p in self.checkpoint_dir.glob("step-*.pt"))
        self.flushes.append((last, existing))


def test_the_sink_is_flushed_right_before_each_checkpoint(small_config, cache_dir, tmp_path):
    sink = FlushRecordingSink(tmp_path)
    trainer.train(small_config(), sink, cache_dir=cache_dir, checkpoint_dir=tmp_path)
    # checkpoint_every 2: flushed after logging steps 2, 4, 6, each time before that step's checkpoint;
    # the newest two checkpoints are kept.
    assert sink.flushes == [
        (2, []),
        (4, ["step-000002.pt"]),
        (6, ["step-000002.pt", "step-000004.pt"]),
    ]
    assert sorted(p.name for p in tmp_path.glob("step-*.pt")) == ["step-000004.pt", "step-000006.pt"]


def test_the_trainer_reports_each_phase_it_enters(small_config, cache_dir, tmp_path):
    config = small_config(steps=4)
    models.tiny_model_path(config, tasks.build(config.task), cache_dir)  # cached: no warm start below
    sink = ListSink()
    trainer.train(config, sink, cache_dir=cache_dir, checkpoint_dir=tmp_path)
    # eval_every 3 and the last step; checkpoint_every 2.
    assert sink.phases == [
        ("preparing", {}),
        ("evaluating", {"step": 0}),
        ("training", {"step": 1, "steps": 4}),
        ("training", {"step": 2, "steps": 4}),
        ("checkpointing", {"step": 2}),
        ("training", {"step": 3, "steps": 4}),
        ("evaluating", {"step": 3}),
        ("training", {"step": 4, "steps": 4}),
        ("evaluating", {"step": 4}),
        ("checkpointing", {"step": 4}),
    ]

    resumed = ListSink()
    trainer.train(config, resumed, cache_dir=cache_dir, checkpoint_dir=tmp_path)
    assert resumed.phases == [("preparing", {})], "a finished run resumes straight past its last step"


def damage(path):
    """Flip bytes in the middle of a file, where the tensors are (what the probe did by hand)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    path.write_bytes(bytes(data))


def test_a_damaged_checkpoint_is_passed_over_for_the_one_before(small_config, cache_dir, tmp_path):
    # The default learning rate: at 1e-3 every reward is 0 from step 3 on, the compared steps.
    config = small_config()
    whole = ListSink()
    trainer.train(config, whole, cache_dir=cache_dir)
    trainer.train(config, ListSink(stop_after_step=5), cache_dir=cache_dir, checkpoint_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.glob("step-*.pt")) == ["step-000002.pt", "step-000004.pt"]
    damage(tmp_path / "step-000004.pt")

    resumed = ListSink()
    trainer.train(config, resumed, cache_dir=cache_dir, checkpoint_dir=tmp_path)
    assert [step for step, _ in resumed.points] == [3, 4, 5, 6], "resumed after step 2, not 4"
    assert without_timing(resumed.points) == without_timing(whole.points)[3:]
    assert_trained(resumed.points)
    assert resumed.notes == [
        "resumed from step-000002.pt, passing over step-000004.pt does not match the sha256 recorded when "
        "it was written (damaged or altered)"
    ]
    assert (tmp_path / "step-000004.pt.rejected").exists(), "set aside, never read again"


def test_no_trustworthy_checkpoint_fails_saying_so_and_a_retry_starts_over(small_config, cache_dir, tmp_path):
    config = small_config(steps=4)
    whole = ListSink()
    trainer.train(config, whole, cache_dir=cache_dir)
    trainer.train(config, ListSink(stop_after_step=3), cache_dir=cache_dir, checkpoint_dir=tmp_path)
    (tmp_path / "step-000002.pt").write_bytes((tmp_path / "step-000002.pt").read_bytes()[:1000])  # truncated
    with pytest.raises(
        checkpoints.CheckpointError, match="no checkpoint can be trusted: step-000002.pt does not match"
    ):
        trainer.train(config, ListSink(), cache_dir=cache_dir, checkpoint_dir=tmp_path)

    again = ListSink()
    trainer.train(config, again, cache_dir=cache_dir, checkpoint_dir=tmp_path)
    assert without_timing(again.points) == without_timing(whole.points), "from step 0, the same curve"
    assert_trained(whole.points)


class Payload:
    """What a hostile checkpoint would carry: unpickling it runs `touch`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_holding_code_is_refused_without_running_it(small_config, cache_dir, tmp_path):
    config = small_config(steps=2)
    trainer.train(config, ListSink(), cache_dir=cache_dir, checkpoint_dir=tmp_path)
    path = tmp_path / "step-000002.pt"
    state = torch.load(path, weights_only=True)
    marker = tmp_path / "code-ran"
    state["progress"] = Payload(marker)
    torch.save(state, path)
    # Even with its sha256 in the ledger (whoever writes the folder writes checkpoints.json too).
    sha256, size = checkpoints.file_sha256(path)
    checkpoints.FileLedger(tmp_path).record(2, sha256, size)
    with pytest.raises(checkpoints.CheckpointError, match="cannot be read as a checkpoint"):
        trainer.train(config, ListSink(), cache_dir=cache_dir, checkpoint_dir=tmp_path)
    assert not marker.exists()


def test_a_checkpoint_of_another_config_is_refused(small_config, cache_dir, tmp_path):
    trainer.train(small_config(steps=2), ListSink(), cache_dir=cache_dir, checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match="different run config"):
        trainer.train(small_config(steps=2, seed=9), ListSink(), cache_dir=cache_dir, checkpoint_dir=tmp_path)


def test_stop_is_honoured_between_steps(small_config, cache_dir):
    sink = ListSink(stop_after_step=2)
    summary = trainer.train(small_config(), sink, cache_dir=cache_dir)
    assert [step for step, _ in sink.points] == [0, 1, 2]
    assert summary["steps"] == 2 and summary["completed"] == 0.0


def test_micro_batches_give_the_same_update(small_config, cache_dir):
    curves = []
    for micro in (None, 3):
        sink = ListSink()
        trainer.train(small_config(steps=3, optimizer={"micro_batch_size": micro}), sink, cache_dir=cache_dir)
        curves.append(sink.points)
    assert_trained(curves[0])
    for (_, a), (_, b) in zip(*curves, strict=True):
        for name in set(a) - TIMING:
            # The engine-vs-trainer gap at one precision is float error itself (~1e-6).
            tolerance = 1e-5 if name.startswith("mismatch/") else 1e-6
            assert a[name] == pytest.approx(b[name], rel=1e-4, abs=tolerance), name


def test_an_evaluation_in_chunks_equals_one_in_one_piece(small_config, cache_dir, monkeypatch):
    """Evaluations go through the held-out set in chunks sized for memory (a real vocabulary's θ0
    logits of a whole held-out set do not fit): the chunks change no sample and no metric."""
    config = small_config(steps=2, eval_size=24, optimizer={"lr": 1e-3})
    learner = trainer.prepare(config, cache_dir)
    source = trainer.local_source(learner, cache_dir)
    for step in (1, 2):  # a policy that moved away from θ0, so eval/kl_init is not ~0
        trainer.run_step(learner, source, step)
    whole = learner.evaluator.evaluate(learner.policy, step=2)
    monkeypatch.setattr(models, "EVAL_ROWS", 5)
    monkeypatch.setattr(evaluate, "EVAL_LOGITS", 1)  # one prompt per θ0 chunk
    scored_rows = []
    score = evaluate.score_responses
    monkeypatch.setattr(
        evaluate,
        "score_responses",
        lambda model, r, *a: scored_rows.append(r.response_ids.shape[0]) or score(model, r, *a),
    )
    chunked = learner.evaluator.evaluate(learner.policy, step=2)
    assert scored_rows == [1] * 24
    assert whole["eval/kl_init"] > 1e-6
    assert chunked == pytest.approx(whole, rel=1e-5, abs=1e-9)


def test_an_evaluation_made_in_parts_elsewhere_adds_up_to_the_trainers(small_config, cache_dir):
    """Rollout workers evaluate parts of the held-out set with a copy of the policy loaded from
    published weights and their own θ0: the sums of the parts give the trainer's metrics."""
    config = small_config(steps=2, eval_size=24, optimizer={"lr": 1e-3})
    learner = trainer.prepare(config, cache_dir)
    source = trainer.local_source(learner, cache_dir)
    for step in (1, 2):
        trainer.run_step(learner, source, step)
    whole = learner.evaluator.evaluate(learner.policy, step=2)

    elsewhere = trainer.prepare(config, cache_dir)  # another process: θ0 only
    policy = copy.deepcopy(elsewhere.policy)
    policy.load_state_dict({k: v.clone() for k, v in learner.policy.state_dict().items()})
    problems = elsewhere.task.eval_problems(config.eval_size)
    parts = [
        evaluate.evaluate_part(
            config, elsewhere.lm, policy, elsewhere.initial, elsewhere.task, problems[lo:hi], 2, lo
        )
        for lo, hi in ((0, 7), (7, 16), (16, 24))
    ]
    total = sum(parts, evaluate.EvalSums())
    assert total.n == 24 and whole["eval/kl_init"] > 1e-6
    assert total.metrics() == pytest.approx(whole, rel=1e-5, abs=1e-9)
    # A part evaluated with the wrong first index samples other responses: the index matters.
    shifted = evaluate.evaluate_part(
        config, elsewhere.lm, policy, elsewhere.initial, elsewhere.task, problems[7:16], 2, 0
    )
    assert shifted.k3 != pytest.approx(parts[1].k3, rel=1e-6)


def test_nan_weights_stop_the_run_as_diverged_and_keep_what_was_logged(small_config, cache_dir, tmp_path):
    config = small_config()
    task = tasks.build(config.task)
    lm = models.load(config, torch.device("cpu"), cache_dir, task)
    with torch.no_grad():
        lm.model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    lm.model.save_pretrained(tmp_path / "broken")
    lm.tokenizer.save_pretrained(tmp_path / "broken")
    sink = ListSink()
    with pytest.raises(trainer.Diverged, match="diverged at step 1"):
        trainer.train(small_config(model={"source": "local", "path": str(tmp_path / "broken")}), sink)
    assert [step for step, _ in sink.points] == [0]


def test_lr_schedules():
    from rlcore.config import RunConfig

    def factors(**opt):
        config = RunConfig.model_validate({"steps": 10, "optimizer": opt})
        return [trainer.lr_factor(config, s) for s in range(10)]

    assert factors() == [1.0] * 10
    assert factors(warmup_steps=4)[:5] == [0.25, 0.5, 0.75, 1.0, 1.0]
    linear = factors(schedule="linear")
    assert linear[0] == 1.0 and linear[5] == pytest.approx(0.5)
    cosine = factors(schedule="cosine", warmup_steps=2)
    assert cosine[2] == 1.0 and cosine[-1] < 0.1


def test_theta0_logprobs_made_with_the_batch_give_the_same_curve(small_config, cache_dir):
    """`execution.init_logprobs: rollout` moves θ0's forward pass from the update to wherever the
    batch is made (a rollout worker in distributed and async execution); kl/init and its k1/k3
    estimators come out the same, and so does everything else. `auto` in one process (simulated)
    leaves it to the trainer: there is no other side with time to spare."""
    curves, given = [], []
    for where in ("trainer", "auto", "rollout"):
        config = small_config(steps=4, optimizer={"lr": 1e-3}, execution={"init_logprobs": where})
        learner = trainer.prepare(config, cache_dir)
        source = trainer.local_source(learner, cache_dir)
        points = []
        for step in range(1, 5):
            batch, metrics = trainer.run_step(learner, source, step)
            given.append(batch.init_logp is not None)
            points.append(metrics)
        curves.append(points)
    assert given == [False] * 8 + [True] * 4
    assert curves[0][-1]["kl/init"] > 1e-4, "the policy moved away from θ0"
    assert_trained(list(enumerate(curves[0], start=1)))
    for other in curves[1:]:
        for a, b in zip(curves[0], other, strict=True):
            for name in set(a) - TIMING:
                assert b[name] == pytest.approx(a[name], rel=1e-5, abs=1e-7), name


def test_theta0_logprobs_too_large_for_a_batch_are_left_to_the_trainer(small_config, cache_dir, monkeypatch):
    from rlcore import produce

    learner = trainer.prepare(small_config(execution={"init_logprobs": "rollout"}), cache_dir)
    source = trainer.local_source(learner, cache_dir)
    monkeypatch.setattr(produce, "INIT_LOGP_FLOATS", 10)
    batch, metrics = trainer.run_step(learner, source, 1)
    assert batch.init_logp is None
    assert metrics["kl/init"] == pytest.approx(0.0, abs=1e-7), "the trainer computed it: step 1 trains θ0"


def test_every_metric_name_is_documented_in_section_7():
    """docs/algorithms.md §7 names every metric the trainer logs (`a/b|c` stands for a/b and a/c)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "algorithms.md").read_text()
    section = text.split("\n## 7. Metrics\n", 1)[1].split("\n## 8.", 1)[0]
    named = set()
    for code in re.findall(r"`([^`]+)`", section):
        head, *alternatives = code.split("|")
        named.add(head)
        named.update(head.rsplit("/", 1)[0] + "/" + alt for alt in alternatives if "/" in head)
    listed = ALL_METRICS
    assert sorted(set(listed) - named) == []
