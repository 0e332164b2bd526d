"""Shared fixtures for rlcore tests: a small, fast built-in model config and one model cache."""

import pytest

from rlcore.config import RunConfig

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


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="session")
def small_config():
    """RunConfig of a small, fast run; keyword overrides merge into nested sections."""

    def make(**overrides) -> RunConfig:
        return RunConfig.model_validate(merge(SMALL, overrides))

    return make
