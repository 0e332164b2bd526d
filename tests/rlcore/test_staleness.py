"""The staleness schedule of docs/algorithms.md §6 and the local batch source that obeys it."""

import pytest
import torch

from rlcore import trainer
from rlcore.rollout import score_responses, token_logprobs
from rlcore.sources import LocalSource
from rlcore.staleness import behavior_version, staleness

# (t, k, d) -> (v, lag), transcribed from the table of §6.
SCHEDULES = {(1, 0): "k1d0", (1, 10): "k1d10", (20, 0): "k20d0", (20, 10): "k20d10", (4, 2): "k4d2"}
TABLE = {
    1: [(0, 0), (0, 0), (0, 0), (0, 0), (0, 0)],
    2: [(1, 0), (0, 1), (0, 1), (0, 1), (0, 1)],
    10: [(9, 0), (0, 9), (0, 9), (0, 9), (4, 5)],
    11: [(10, 0), (0, 10), (0, 10), (0, 10), (8, 2)],
    12: [(11, 0), (1, 10), (0, 11), (0, 11), (8, 3)],
    21: [(20, 0), (10, 10), (20, 0), (0, 20), (16, 4)],
    31: [(30, 0), (20, 10), (20, 10), (20, 10), (28, 2)],
    41: [(40, 0), (30, 10), (40, 0), (20, 20), (36, 4)],
}


@pytest.mark.parametrize("t", list(TABLE))
def test_schedule_reproduces_the_spec_table(t):
    for (k, d), (v, lag) in zip(SCHEDULES, TABLE[t], strict=True):
        assert behavior_version(t, k, d) == v, (t, k, d)
        assert staleness(t, k, d) == lag, (t, k, d)


def test_offline_always_uses_the_initial_policy():
    assert [behavior_version(t, 1, 0, offline=True) for t in (1, 2, 50)] == [0, 0, 0]
    assert staleness(50, offline=True) == 49


def test_invalid_schedule_arguments_are_refused():
    with pytest.raises(ValueError, match="step must be >= 1"):
        behavior_version(0)
    with pytest.raises(ValueError, match="sync_interval >= 1"):
        behavior_version(3, 0, 0)


class RecordingEngine:
    """Stands in for the weights: remembers which policy version it was synced to."""

    def __init__(self):
        self.version = None
        self.syncs = []

    def sync(self, policy):
        self.version = policy["version"]
        self.syncs.append(self.version)


class RecordingProducer:
    """Makes a batch that says which version the engine held, and checks it is the one asked for."""

    def __init__(self):
        self.engine = RecordingEngine()
        self.generated = {}

    def batch(self, step, version):
        assert step not in self.generated, f"step {step} generated twice"
        assert self.engine.version == version, (
            f"step {step}: asked for {version}, engine holds {self.engine.version}"
        )
        self.generated[step] = version
        return {"step": step, "version": self.engine.version}


@pytest.mark.parametrize(
    "k,d,offline",
    [(1, 0, False), (1, 10, False), (20, 0, False), (20, 10, False), (4, 2, False), (3, 0, True)],
)
def test_every_batch_is_generated_by_the_version_the_schedule_names(k, d, offline):
    total = 45
    producer = RecordingProducer()
    source = LocalSource(producer, total, k, d, offline)
    max_queue = 0
    for step in range(1, total + 1):
        source.publish(step - 1, {"version": step - 1})
        batch = source.take(step)
        assert batch == {"step": step, "version": behavior_version(step, k, d, offline)}
        max_queue = max(max_queue, len(source.queue))
    needed = sorted({behavior_version(t, k, d, offline) for t in range(1, total + 1)})
    assert producer.engine.syncs == needed, "the engine syncs exactly to the versions some step needs"
    assert max_queue <= d + k, "rollouts run at most sync_offset (+ interval) steps ahead"
    if d == 0:
        assert max_queue == 0, "without an offset every batch is generated when its step comes"


def test_under_sync_interval_4_step_3_trains_on_theta0_log_probs(small_config, cache_dir):
    config = small_config(staleness={"sync_interval": 4}, optimizer={"lr": 3e-3})
    learner = trainer.prepare(config, cache_dir)
    source = trainer.local_source(learner, cache_dir)
    batches = {}
    for step in (1, 2, 3):
        batches[step], metrics = trainer.run_step(learner, source, step)
        assert metrics["staleness"] == step - 1
        assert metrics["policy_version"] == 0
    rollout = batches[3].rollout
    mask = rollout.response_mask.bool()
    with torch.no_grad():
        theta0, _ = token_logprobs(score_responses(learner.initial, rollout), rollout.response_ids, 1.0)
        current, _ = token_logprobs(score_responses(learner.policy, rollout), rollout.response_ids, 1.0)
    assert torch.allclose(rollout.logp[mask], theta0[mask], atol=1e-5)
    assert (rollout.logp[mask] - current[mask]).abs().max() > 1e-3, "the policy has moved on since θ0"


def test_kl_behavior_is_zero_on_policy_and_positive_when_stale(small_config, cache_dir):
    def metrics_of(**staleness_cfg):
        learner = trainer.prepare(small_config(staleness=staleness_cfg, optimizer={"lr": 3e-3}), cache_dir)
        source = trainer.local_source(learner, cache_dir)
        return [trainer.run_step(learner, source, step)[1] for step in range(1, 6)]

    for m in metrics_of():
        assert abs(m["kl/behavior"]) < 1e-6
        assert m["is_ratio/max"] == pytest.approx(1.0, abs=1e-4)
        assert m["staleness"] == 0
    offline = metrics_of(offline=True)
    assert [m["staleness"] for m in offline] == [0, 1, 2, 3, 4]
    # k1 is unbiased but noisy on a small batch; k3 is never negative and shows the gap.
    assert abs(offline[-1]["kl/behavior"]) > 1e-5
    assert offline[-1]["kl/behavior_k3"] > 1e-5
    assert abs(offline[-1]["is_ratio/max"] - 1) > 1e-3, "the behaviour and current policies differ"
