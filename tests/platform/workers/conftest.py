"""Every test here that used the database ends with each run's metric summaries agreeing with its
points (`support.summaries_disagreeing`): a chaos test that loses a point, or counts one twice,
fails even where it asserts nothing about metrics."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support import summaries_disagreeing


@pytest.fixture(autouse=True)
def summaries_agree_with_points(request) -> Iterator[None]:
    database = next((f for f in ("transactional_db", "db") if f in request.fixturenames), None)
    if database is None and request.node.get_closest_marker("django_db") is None:
        yield
        return
    request.getfixturevalue(database or "db")  # set up first, so torn down after this check
    yield
    assert summaries_disagreeing() == []
