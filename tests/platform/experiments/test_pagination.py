"""The experiment and run lists come a page at a time: `?page=` with previous / next links that
keep the filters on the pages, `limit` / `offset` with next / previous URLs in the API; every
item is on exactly one page, in a stable order."""

from __future__ import annotations

import re
from html import unescape
from urllib.parse import parse_qs, urlsplit

import pytest
from django.urls import reverse
from support import TINY_CONFIG

from accounts.models import ApiToken
from experiments import run_list, views
from experiments.models import Experiment, Run
from experiments.sweeps import expand

pytestmark = pytest.mark.django_db


@pytest.fixture
def experiments(team, alice) -> list[Experiment]:
    """27 experiments, oldest first (all created in the same instant: the id breaks the tie)."""
    return [Experiment.objects.create(team=team, owner=alice, name=f"e{i:02d}", spec={}) for i in range(27)]


@pytest.fixture
def runs(experiments) -> list[Run]:
    """Seven runs of one experiment, each with its own seed."""
    sweep = expand(TINY_CONFIG, ["grpo"], [{}], list(range(7)))
    return [Run.create_for(experiments[0], config) for config in sweep.configs]


def names(html: str) -> list[str]:
    return re.findall(r'<a href="/experiments/\d+/">(e\d\d)</a>', html)


def link(html: str, rel: str) -> str | None:
    found = re.search(rf'<a href="([^"]+)" rel="{rel}">', html)
    return unescape(found.group(1)) if found else None


def test_the_experiment_list_pages_newest_first(alice_client, experiments, team):
    url = reverse("experiment-list")
    first = alice_client.get(url, {"team": team.pk}).content.decode()
    assert views.EXPERIMENTS_PER_PAGE == 25
    assert names(first) == [f"e{i:02d}" for i in range(26, 1, -1)]
    assert "page 1 of 2 (1–25 of 27)" in first and link(first, "prev") is None
    assert parse_qs(link(first, "next")[1:]) == {"team": [str(team.pk)], "page": ["2"]}

    second = alice_client.get(url + link(first, "next")).content.decode()
    assert names(second) == ["e01", "e00"] and "page 2 of 2 (26–27 of 27)" in second
    assert link(second, "next") is None and parse_qs(link(second, "prev")[1:])["page"] == ["1"]


def test_a_page_that_is_not_a_number_or_past_the_last_says_so(alice_client, experiments):
    url = reverse("experiment-list")
    bad = alice_client.get(url, {"page": "two"}).content.decode()
    assert "page must be a whole number from 1 to 2 (got &#x27;two&#x27;); showing page 1" in bad
    assert names(bad)[0] == "e26"
    past = alice_client.get(url, {"page": "9"}).content.decode()
    assert "showing page 2" in past and names(past) == ["e01", "e00"]


def test_the_run_list_pages_keep_the_filters(alice_client, runs, monkeypatch):
    monkeypatch.setattr(run_list, "RUNS_PER_PAGE", 3)
    runs[2].cancel()
    url = reverse("run-list")
    seen = []
    page = alice_client.get(url, {"status": "queued"}).content.decode()
    while True:
        seen += [int(pk) for pk in re.findall(r'name="runs" value="(\d+)"', page)]
        following = link(page, "next")
        if following is None:
            break
        assert parse_qs(following[1:])["status"] == ["queued"]
        page = alice_client.get(url + following).content.decode()
    assert seen == [run.pk for run in reversed(runs) if run != runs[2]]
    assert "page 2 of 2 (4–6 of 6)" in page


def test_the_api_lists_pages_with_limit_and_offset(client, alice, experiments, runs):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(alice)}"}
    first = client.get("/api/experiments", {"limit": 10}, **auth).json()
    assert (first["count"], first["limit"], first["offset"], first["previous"]) == (27, 10, 0, None)
    seen = [e["name"] for e in first["items"]]
    page = first
    while page["next"]:
        parts = urlsplit(page["next"])
        assert parts.scheme == "http" and parts.path == "/api/experiments"
        page = client.get(f"{parts.path}?{parts.query}", **auth).json()
        seen += [e["name"] for e in page["items"]]
    assert seen == [f"e{i:02d}" for i in range(26, -1, -1)]
    assert (page["offset"], len(page["items"])) == (20, 7)
    assert parse_qs(urlsplit(page["previous"]).query) == {"limit": ["10"], "offset": ["10"]}

    beyond = client.get("/api/experiments", {"offset": 2**63 - 1}, **auth).json()
    assert beyond["items"] == [] and beyond["next"] is None and beyond["previous"] is not None
    default = client.get("/api/experiments", **auth).json()
    assert default["limit"] == 100 and len(default["items"]) == 27 and default["next"] is None

    run_pages = [
        client.get(
            f"/api/experiments/{runs[0].experiment_id}/runs", {"limit": 3, "offset": offset}, **auth
        ).json()
        for offset in (0, 3, 6, 9)
    ]
    assert [r["id"] for p in run_pages for r in p["items"]] == [run.pk for run in runs]
    assert [p["next"] is None for p in run_pages] == [False, False, True, True]


@pytest.mark.parametrize(
    ("query", "field", "rule"),
    [
        ({"limit": 0}, "limit", "greater than or equal to 1"),
        ({"limit": 1001}, "limit", "less than or equal to 1000"),
        ({"offset": -1}, "offset", "greater than or equal to 0"),
        ({"offset": 2**63}, "offset", "less than or equal to 9223372036854775807"),
        ({"limit": "ten"}, "limit", "valid integer"),
    ],
)
def test_a_bad_limit_or_offset_is_a_422_naming_it(client, alice, query, field, rule):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(alice)}"}
    response = client.get("/api/experiments", query, **auth)
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["field"] == field and rule in error["msg"]
