"""What rlcore's tests share beyond fixtures (tests/rlcore/conftest.py): the small run's config,
nested merges, the step metrics that are timings, and the check that compared curves learned."""

from rlcore.sinks import STEP_METRICS

# The built-in tiny model and task as in examples/arithmetic.yaml (one warm start, shared through
# the session's cache), with smaller batches and fewer steps.
SMALL = {
    "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6},
    "steps": 6,
    "eval_every": 3,
    "eval_size": 16,
    "checkpoint_every": 2,
    "device": "cpu",
}


def merge(base: dict, overrides: dict) -> dict:
    out = dict(base)
    for key, value in overrides.items():
        out[key] = (
            merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


# Wall-clock metrics: the only ones two runs of one config may log differently.
TIMING = {name for name in STEP_METRICS if name.startswith("time/")} | {"tokens_per_s"}


def without_timing(points):
    return [(step, {k: v for k, v in m.items() if k not in TIMING}) for step, m in points]


def assert_trained(points) -> None:
    """`points` ((step, metrics) as a ListSink keeps them) are of a run that learned: at some step
    the rewards differed within a group (reward/std > 0, so some advantage was not 0) and the
    gradient was not 0. Two executions' curves compared where this fails would say nothing of the
    loss, the batches or the log-probs."""
    trained = [step for step, m in points if m.get("reward/std", 0) > 0 and m.get("grad_norm", 0) > 0]
    assert trained, [(step, m.get("reward/std"), m.get("grad_norm")) for step, m in points]
