"""The other sources of off-policyness (docs/algorithms.md §14) through the real trainer: several
optimiser steps per batch (mini-batches, epochs) with the proximal (and loglinear) anchor, M2PO's whole-batch
selection under micro-batching, and the training–inference mismatch of a lower rollout precision."""

import pytest
from pydantic import ValidationError

from rlcore import trainer
from rlcore.sinks import M2PO_METRICS, MISMATCH_METRICS, ListSink
from tests.rlcore.rlcore_helpers import assert_trained, without_timing


def steps_of(sink, name):
    return [metrics[name] for step, metrics in sink.points if step > 0 and name in metrics]


@pytest.mark.parametrize("preset", ["decoupled-ppo", "grpo-tis"])
def test_a_proximal_clip_acts_only_with_several_minibatches(small_config, cache_dir, preset):
    clip = {}
    for minibatches in (1, 4):
        sink = ListSink()
        config = small_config(
            steps=2, algorithm={"preset": preset}, optimizer={"lr": 1e-2, "minibatches": minibatches}
        )
        trainer.train(config, sink, cache_dir=cache_dir)
        clip[minibatches] = steps_of(sink, "clip_frac")
        assert steps_of(sink, "optimizer_steps") == [minibatches] * 2
        # The current policy's KL to μ beside the step-start weights' (§7): one optimiser step, one π.
        current, start = steps_of(sink, "kl/behavior"), steps_of(sink, "kl/behavior_proximal")
        if minibatches == 1:  # π = π_prox wherever the gradient is taken: r ≡ 1
            assert max(abs(k) for k in steps_of(sink, "kl/proximal")) < 1e-5
            assert current == pytest.approx(start, abs=1e-6)
        else:
            assert max(steps_of(sink, "kl/proximal")) > 1e-3
            assert max(abs(a - b) for a, b in zip(current, start, strict=True)) > 1e-4
    assert clip[1] == [0.0, 0.0]
    assert max(clip[4]) > 0


def test_epochs_multiply_the_optimiser_steps(small_config, cache_dir):
    sink = ListSink()
    config = small_config(steps=2, algorithm={"preset": "grpo"}, optimizer={"minibatches": 2, "epochs": 3})
    trainer.train(config, sink, cache_dir=cache_dir)
    assert steps_of(sink, "optimizer_steps") == [6, 6]


@pytest.mark.parametrize("anchor", ["proximal", "loglinear"])
def test_resume_with_minibatches_logs_what_an_uninterrupted_run_logs(
    small_config, cache_dir, tmp_path, anchor
):
    """Lag 2 from step 3 on: a loglinear anchor's p = μ + ½·(π − μ), a proximal one's forward."""
    config = small_config(
        staleness={"sync_offset": 2},
        algorithm={"preset": "decoupled-ppo", "params": {"anchor": anchor}},
        optimizer={"lr": 1e-3, "minibatches": 2, "epochs": 2},
    )
    whole = ListSink()
    trainer.train(config, whole, cache_dir=cache_dir, checkpoint_dir=tmp_path / "whole")
    interrupted = ListSink(stop_after_step=3)
    trainer.train(config, interrupted, cache_dir=cache_dir, checkpoint_dir=tmp_path / "split")
    resumed = ListSink()
    trainer.train(config, resumed, cache_dir=cache_dir, checkpoint_dir=tmp_path / "split")
    assert [step for step, _ in resumed.points] == [3, 4, 5, 6]
    assert without_timing(resumed.points) == without_timing(whole.points)[3:]
    assert_trained(resumed.points)


@pytest.mark.parametrize("anchor", ["behaviour", "proximal"])
def test_m2po_masks_the_same_tokens_with_and_without_micro_batches(small_config, cache_dir, anchor):
    """Whatever the anchor, the mask goes by the data's age, (p − μ)², over the whole batch."""
    masked = []
    for micro in (None, 3):
        sink = ListSink()
        config = small_config(
            steps=3,
            staleness={"offline": True},
            algorithm={"preset": "m2po", "params": {"anchor": anchor}},
            optimizer={"lr": 1e-2, "micro_batch_size": micro},
        )
        trainer.train(config, sink, cache_dir=cache_dir)
        masked.append(
            [
                steps_of(sink, name)
                for name in ("correction/masked_frac", "masked_tokens/staleness", *M2PO_METRICS)
            ]
        )
    assert masked[0][:2] == masked[1][:2]
    share, count, before, after = masked[0]
    assert before + after == pytest.approx(masked[1][2] + masked[1][3], rel=1e-5, abs=1e-6)
    assert max(share) > 0 and min(share) == 0.0  # step 1 is on-policy (θ = θ0)
    assert [c > 0 for c in count] == [s > 0 for s in share]
    assert before[0] == pytest.approx(0, abs=1e-10) and after[0] == before[0]
    # M2PO's second moment, before its selection and after it: within τ (0.04) once it masks.
    for s, b, a in zip(share, before, after, strict=True):
        assert a <= 0.04 + 1e-12 and a <= b and (s > 0) == (b > 0.04)


def test_the_rollout_precision_makes_a_mismatch_that_tis_corrects(small_config, cache_dir):
    seen = {}
    for dtype in ("same", "bfloat16"):
        sink = ListSink()
        config = small_config(steps=2, algorithm={"preset": "grpo-tis"}, rollout={"dtype": dtype})
        trainer.train(config, sink, cache_dir=cache_dir)
        seen[dtype] = {
            name: steps_of(sink, name)
            for name in ("mismatch/k1", "mismatch/abs_max", "correction/weight_mean", *MISMATCH_METRICS[3:])
        }
    same, low = seen["same"], seen["bfloat16"]
    for run in (same, low):  # the drift t − μ, signed (−k1) and absolute, between |k1| and abs_max
        assert run["mismatch/drift_mean"] == pytest.approx([-k for k in run["mismatch/k1"]], abs=1e-9)
        for signed, absolute, worst in zip(
            run["mismatch/drift_mean"], run["mismatch/drift_abs_mean"], run["mismatch/abs_max"], strict=True
        ):
            assert abs(signed) <= absolute + 1e-12 and absolute <= worst + 1e-12
    # bfloat16 rounds both ways: its absolute drift is far more than what the signed one keeps.
    assert min(low["mismatch/drift_abs_mean"]) > 2 * max(abs(d) for d in low["mismatch/drift_mean"])
    assert max(abs(k) for k in same["mismatch/k1"]) < 1e-6
    assert max(same["mismatch/abs_max"]) < 1e-4
    assert max(abs(w - 1) for w in same["correction/weight_mean"]) < 1e-5
    assert min(low["mismatch/abs_max"]) > 1e-2
    assert max(abs(k) for k in low["mismatch/k1"]) > 1e-5
    # On-policy, the TIS weights min(π_prox/μ, C) are not 1: the engine's μ is the bfloat16 model's.
    assert max(abs(w - 1) for w in low["correction/weight_mean"]) > 1e-4


@pytest.mark.parametrize(
    ("overrides", "field", "rule"),
    [
        ({"optimizer": {"minibatches": 5}}, "optimizer.minibatches", "must be <= rollout.prompts_per_step"),
        ({"optimizer": {"epochs": 9}}, "optimizer.epochs", "less than or equal to 8"),
        ({"rollout": {"dtype": "float8"}}, "rollout.dtype", "same"),
    ],
)
def test_bad_settings_name_the_field(small_config, overrides, field, rule):
    from rlcore.config import error_list

    with pytest.raises(ValidationError) as caught:
        small_config(**overrides)
    errors = error_list(caught.value)
    assert any(name == field and rule in message for name, message in errors), errors


def test_bapo_searches_its_bounds_per_mini_batch_the_same_with_and_without_micro_batches(
    small_config, cache_dir
):
    """BAPO's bounds are searched over each whole mini-batch under the weights it is trained at,
    before any backward (docs/algorithms.md §16): micro-batching changes neither them nor the run."""
    runs = []
    for micro in (None, 3):
        sink = ListSink()
        config = small_config(
            steps=2,
            staleness={"offline": True},
            algorithm={"preset": "bapo"},
            optimizer={"lr": 1e-2, "minibatches": 2, "micro_batch_size": micro},
        )
        trainer.train(config, sink, cache_dir=cache_dir)
        runs.append(sink)
    for name in ("bapo/c_low", "bapo/c_high"):
        assert steps_of(runs[0], name) == steps_of(runs[1], name), name
    # The balance s to float32's rounding of the weights after step 1 (sums in another order).
    assert steps_of(runs[0], "bapo/s") == pytest.approx(steps_of(runs[1], "bapo/s"), rel=1e-4)
    assert max(steps_of(runs[0], "bapo/c_low")) > 0.6, "the search moved the bounds"
    assert steps_of(runs[0], "grad_norm") == pytest.approx(steps_of(runs[1], "grad_norm"), rel=1e-4)
    assert steps_of(runs[0], "eval/accuracy") == steps_of(runs[1], "eval/accuracy")
