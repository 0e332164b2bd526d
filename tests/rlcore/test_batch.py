"""Batches: produced group by group they equal the whole, and their files round-trip exactly."""

import pytest
import torch

from rlcore import models, tasks
from rlcore.batch import Batch
from rlcore.produce import Producer, make_engine


@pytest.fixture(scope="module")
def producer(small_config, cache_dir):
    config = small_config(seed=5)
    task = tasks.build(config.task)
    lm = models.load(config, torch.device("cpu"), cache_dir, task)
    return Producer(config, task, lm, make_engine(config, lm, cache_dir, task))


def assert_same_batch(a: Batch, b: Batch, logp_atol: float = 0.0) -> None:
    assert (a.step, a.version) == (b.step, b.version)
    assert a.problems == b.problems and a.completions == b.completions
    assert torch.equal(a.rewards, b.rewards) and torch.equal(a.correct, b.correct)
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "finished"):
        assert torch.equal(getattr(a.rollout, name), getattr(b.rollout, name)), name
    assert (a.rollout.logp - b.rollout.logp).abs().max() <= logp_atol


def test_a_step_made_in_parts_equals_the_step_made_whole(producer):
    whole = producer.batch(step=3, version=2)
    parts = [producer.batch(3, 2, range(0, 1)), producer.batch(3, 2, range(1, 4))]
    assert [len(p.problems) for p in parts] == [4, 12]
    # Float sums over other batch shapes may differ in the last bits; tokens may not.
    assert_same_batch(Batch.concat(parts), whole, logp_atol=1e-5)
    assert Batch.concat(parts).versions().tolist() == [2] * 16
    assert producer.batch(step=4, version=2).completions != whole.completions


def test_a_batch_file_round_trips_exactly_and_checks_its_hash(producer, tmp_path):
    batch = producer.batch(step=2, version=1)
    digest = batch.save(tmp_path / "b.safetensors")
    loaded = Batch.load(tmp_path / "b.safetensors", sha256=digest)
    assert_same_batch(loaded, batch)
    assert loaded.rollout.logp.dtype == torch.float32 and loaded.correct.dtype == torch.bool
    assert loaded.generate_s == batch.generate_s
    with pytest.raises(ValueError, match="does not match its recorded sha256"):
        Batch.load(tmp_path / "b.safetensors", sha256="0" * 64)


def test_parts_of_different_steps_do_not_concatenate(producer):
    with pytest.raises(ValueError, match="share one step"):
        Batch.concat([producer.batch(1, 0, range(0, 1)), producer.batch(2, 0, range(1, 2))])


def test_theta0_logprobs_travel_with_the_batch_and_its_parts(small_config, cache_dir, tmp_path):
    config = small_config(seed=5, execution={"init_logprobs": "rollout"})
    task = tasks.build(config.task)
    lm = models.load(config, torch.device("cpu"), cache_dir, task)
    producer = Producer(config, task, lm, make_engine(config, lm, cache_dir, task), initial=lm.model)
    whole = producer.batch(step=3, version=0)
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    longest = whole.rollout.trimmed().response_ids.shape[1]
    assert whole.init_logp.shape == (16, longest, vocab)
    # θ0 generated it (version 0): its own log-probs of the sampled tokens are the behaviour's.
    sampled = whole.init_logp.gather(-1, whole.rollout.response_ids[:, :longest, None]).squeeze(-1)
    mask = whole.rollout.response_mask[:, :longest]
    assert ((sampled - whole.rollout.logp[:, :longest]) * mask).abs().max() < 1e-5
    digest = whole.save(tmp_path / "b.safetensors")
    assert torch.equal(Batch.load(tmp_path / "b.safetensors", digest).init_logp, whole.init_logp)
    parts = Batch.concat([producer.batch(3, 0, range(0, 1)), producer.batch(3, 0, range(1, 4))])
    width = min(parts.init_logp.shape[1], longest)
    real = mask[:, :width, None].bool()
    assert torch.allclose(parts.init_logp[:, :width] * real, whole.init_logp[:, :width] * real, atol=1e-5)
    without = producer.batch(3, 0, range(0, 1))
    without.init_logp = None
    assert Batch.concat([without, producer.batch(3, 0, range(1, 4))]).init_logp is None
