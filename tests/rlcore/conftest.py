"""Shared fixtures for rlcore tests: a small, fast built-in model config and one model cache."""

import pytest

from rlcore.config import RunConfig
from tests.rlcore.rlcore_helpers import SMALL, merge


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="session")
def small_config():
    """RunConfig of a small, fast run; keyword overrides merge into nested sections."""

    def make(**overrides) -> RunConfig:
        return RunConfig.model_validate(merge(SMALL, overrides))

    return make
