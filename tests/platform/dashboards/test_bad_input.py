"""Bad input that once answered 500 answers 422 naming its field, through the API and the pages
alike: a lone surrogate ("\\ud800", which UTF-8 cannot encode) in any text a claim, a report, a view,
a note or a tag query takes; a NUL in a claim's title; a report block's link that is no URL
(`http://[::1/`); a claim over runs that are all archived. (The runs query's bad input:
test_runquery.py.) A form's body cannot carry a lone surrogate (Django decodes it as U+FFFD), so
the pages that take forms are checked with the rest."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse
from django.utils import timezone
from sample_experiments import make_finished_experiment

from dashboards.models import Claim, Report
from experiments.models import Note, RunTag, SavedView

pytestmark = pytest.mark.django_db

SURROGATE = "a\ud800b"
NUL = "a\x00b"
NO_URL = "{{ table http://[::1/compare/ }}"
# pydantic's words for a lone surrogate (the API's sweeps refuse it so: lab.schemas.NoNul)
NOT_UNICODE = "unable to parse raw data as a unicode string"
NUL_PATTERN = "should match pattern"


@pytest.fixture
def grid(team, alice):
    """reinforce, grpo × on-policy, sync_offset=2, seed 0: finished."""
    return make_finished_experiment(team, alice, name="grid", seeds=(0,))


@pytest.fixture
def api(client, token):
    def call(method: str, path: str, body) -> tuple[int, list[dict]]:
        answer = getattr(client, method)(
            f"/api{path}",
            json.dumps(body),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
        assert answer.status_code != 500
        return answer.status_code, answer.json().get("detail")

    return call


def claim(grid, **fields) -> dict:
    ids = sorted(grid.runs.values_list("pk", flat=True))
    return {"runs": ids, "parts": [{"kind": "holds", "x": "grpo"}], "settings": ["sync_offset=2"]} | fields


def with_part(grid, **part) -> dict:
    return claim(grid, parts=[{"kind": "holds", "x": "grpo"} | part])


# (what, method, path, body, field, words): the body made of the grid and a run of it.
BAD_BODIES = [
    ("claim title, surrogate", "post", "/claims", lambda g, r: claim(g, title=SURROGATE), "title", NOT_UNICODE),
    ("claim title, NUL", "post", "/claims", lambda g, r: claim(g, title=NUL), "title", NUL_PATTERN),
    ("claim part's line", "post", "/claims", lambda g, r: with_part(g, x=SURROGATE), "parts.0.x", NOT_UNICODE),
    ("claim setting", "post", "/claims", lambda g, r: claim(g, settings=[SURROGATE]), "settings.0", NOT_UNICODE),
    ("claim metric", "post", "/claims", lambda g, r: claim(g, metric=SURROGATE), "metric", NOT_UNICODE),
    ("new report title", "post", "/reports", lambda g, r: {"title": SURROGATE}, "title", NOT_UNICODE),
    ("new report source", "post", "/reports", lambda g, r: {"title": "t", "source": SURROGATE}, "source", NOT_UNICODE),
    ("new report link", "post", "/reports", lambda g, r: {"title": "t", "source": NO_URL}, "source", "line 1: 'http://[::1/compare/' is not a link (Invalid IPv6 URL)"),
    ("report title", "put", "/reports/{report}", lambda g, r: {"title": SURROGATE}, "title", NOT_UNICODE),
    ("report source", "put", "/reports/{report}", lambda g, r: {"source": "x\n" + SURROGATE}, "source", NOT_UNICODE),
    ("report link", "put", "/reports/{report}", lambda g, r: {"source": "# t\n\n" + NO_URL}, "source", "line 3: 'http://[::1/compare/' is not a link"),
    ("view name", "post", "/views", lambda g, r: {"name": SURROGATE, "query": "seed = 0"}, "name", NOT_UNICODE),
    ("view query", "post", "/views", lambda g, r: {"name": "v", "query": f"preset = '{SURROGATE}'"}, "query", NOT_UNICODE),
    ("run note", "post", "/runs/{run}/notes", lambda g, r: {"text": SURROGATE}, "text", NOT_UNICODE),
    ("experiment note", "post", "/experiments/{grid}/notes", lambda g, r: {"text": SURROGATE}, "text", NOT_UNICODE),
    ("tag query", "post", "/runs/tags", lambda g, r: {"q": f"preset = '{SURROGATE}'", "add": ["x"]}, "q", NOT_UNICODE),
    ("tag", "post", "/runs/tags", lambda g, r: {"runs": [r], "add": [SURROGATE]}, "add.0", NOT_UNICODE),
    ("experiment tag", "post", "/experiments/{grid}/tags", lambda g, r: {"remove": [SURROGATE]}, "remove.0", NOT_UNICODE),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "method", "body", "field", "words"),
    [pytest.param(path, method, body, field, words, id=what) for what, method, path, body, field, words in BAD_BODIES],
)  # fmt: skip
def test_bad_text_through_the_api_is_a_422_naming_its_field(
    api, grid, alice, path, method, body, field, words
):
    run = grid.runs.first()
    report = Report.objects.create(team=grid.team, author=alice, title="kept", source="kept")
    status, detail = api(method, path.format(grid=grid.pk, run=run.pk, report=report.pk), body(grid, run.pk))
    assert status == 422
    (entry,) = detail
    assert entry["field"] == field and words in entry["msg"], entry
    report.refresh_from_db()
    assert (report.title, report.source) == ("kept", "kept")
    assert not Claim.objects.exists() and not SavedView.objects.exists() and not Note.objects.exists()
    assert not RunTag.objects.exists() and not Report.objects.exclude(pk=report.pk).exists()


def test_a_claim_over_runs_that_are_all_archived_is_a_422(api, client, alice, grid):
    ids = sorted(grid.runs.values_list("pk", flat=True))
    grid.runs.filter(pk__in=ids[:2]).update(archived=timezone.now())
    status, detail = api("post", "/claims", claim(grid, runs=ids[:2]))
    assert (status, detail) == (
        422,
        [
            {
                "loc": ["body", "runs"],
                "field": "runs",
                "msg": "these runs are all archived: unarchive them, or name others",
            }
        ],
    )
    client.force_login(alice)
    page = client.post(
        reverse("claim-new"), json.dumps(claim(grid, runs=ids[:2])), content_type="application/json"
    )
    assert page.status_code == 422 and page.json()["detail"][0]["field"] == "runs"
    grid.runs.update(archived=timezone.now())
    status, detail = api("post", "/claims", {**claim(grid), "runs": None, "experiment": grid.pk})
    assert status == 422 and detail[0]["field"] == "experiment"
    assert detail[0]["msg"] == f"experiment {grid.pk} has no runs that are not archived"
    assert not Claim.objects.exists()


@pytest.mark.parametrize(
    ("title", "words"), [(NUL, NUL_PATTERN), (SURROGATE, NOT_UNICODE)], ids=["NUL", "surrogate"]
)
def test_the_comparison_pages_claim_form_refuses_a_bad_title_with_a_422(alice_client, grid, title, words):
    answer = alice_client.post(
        reverse("claim-new"), json.dumps(claim(grid, title=title)), content_type="application/json"
    )
    assert answer.status_code == 422
    (entry,) = answer.json()["detail"]
    assert entry["field"] == "title" and words in entry["msg"]
    assert not Claim.objects.exists()


def test_the_report_editor_names_a_link_that_is_no_url_and_keeps_the_draft(alice_client, alice, team):
    report = Report.objects.create(team=team, author=alice, title="kept", source="kept")
    edit = reverse("report-edit", args=[report.pk])
    for title, source, error in [
        ("t", f"# t\n\n{NO_URL}", "source: line 3: &#x27;http://[::1/compare/&#x27; is not a link"),
        (NUL, "x", "title: a report&#x27;s title is 1 to 300 characters"),
        ("t", NUL, "source: a report cannot contain NUL characters"),
    ]:
        page = alice_client.post(edit, {"title": title, "source": source, "action": "save"})
        assert page.status_code == 422 and error in page.content.decode()
    report.refresh_from_db()
    assert (report.title, report.source) == ("kept", "kept")
    created = alice_client.post(reverse("report-list"), {"title": NUL})
    assert (
        created.status_code == 200
        and "title: a report&#x27;s title is 1 to 300 characters" in created.content.decode()
    )
    assert Report.objects.count() == 1


def test_the_notes_and_view_forms_refuse_nul_and_store_a_surrogate_as_the_replacement_character(
    alice_client, team, grid
):
    run = grid.runs.first()
    refused = alice_client.post(reverse("run-notes", args=[run.pk]), {"text": NUL}, follow=True)
    assert "text: a note is 1 to" in [str(m) for m in refused.context["messages"]][0]
    refused = alice_client.post(
        reverse("view-save"), {"q": "seed = 0", "name": NUL, "team": team.pk}, follow=True
    )
    assert "name: a view&#x27;s name is 1 to 100 characters" in refused.content.decode()
    assert not Note.objects.exists() and not SavedView.objects.exists()
    # The UTF-8 bytes of a lone surrogate, as a form would send them: decoded as U+FFFD, never a 500.
    for url in (reverse("run-notes", args=[run.pk]), reverse("experiment-notes", args=[grid.pk])):
        answer = alice_client.post(url, "text=a%ED%A0%80b", content_type="application/x-www-form-urlencoded")
        assert answer.status_code == 302
    assert {note.text for note in Note.objects.all()} == {"a\ufffd\ufffd\ufffdb"}
