"""Notes and tags on runs and experiments, from their pages and through the API: kept, shown
escaped, bad tags refused naming the rule, and another team's runs out of reach."""

import json

from django.urls import reverse
from sample_experiments import make_finished_experiment
from support import new_team_member

from accounts.models import ApiToken
from experiments.models import ExperimentTag, Note, RunTag


def test_a_note_and_tags_from_a_runs_page_are_shown_escaped(alice_client, team, alice):
    run = make_finished_experiment(team, alice, presets=("grpo",), staleness=({},), seeds=(0,)).runs.get()
    alice_client.post(reverse("run-notes", args=[run.pk]), {"text": "<script>alert(1)</script> lr too high?"})
    alice_client.post(reverse("run-tags", args=[run.pk]), {"add": "suspect, lr-sweep"})
    page = alice_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt; lr too high?" in page and "<script>alert(1)" not in page
    assert sorted(RunTag.objects.filter(run=run).values_list("name", flat=True)) == ["lr-sweep", "suspect"]
    alice_client.post(reverse("run-tags", args=[run.pk]), {"remove": "suspect"})
    assert list(RunTag.objects.filter(run=run).values_list("name", flat=True)) == ["lr-sweep"]
    bad = alice_client.post(reverse("run-tags", args=[run.pk]), {"add": "no spaces allowed?"}, follow=True)
    assert "a tag is 1 to 50 letters, digits or _ . : + -" in bad.content.decode()


def test_experiment_notes_and_tags_through_the_api(client, token, team, alice):
    experiment = make_finished_experiment(team, alice, seeds=(0,))
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}", "content_type": "application/json"}
    note = client.post(
        f"/api/experiments/{experiment.pk}/notes", json.dumps({"text": "offline diverges"}), **headers
    )
    assert note.status_code == 201 and note.json()["author"] == "alice"
    tags = client.post(
        f"/api/experiments/{experiment.pk}/tags", json.dumps({"add": ["paper", "cpu"]}), **headers
    )
    assert tags.json() == {"tags": ["cpu", "paper"]}
    empty = client.post(f"/api/experiments/{experiment.pk}/notes", json.dumps({"text": "  "}), **headers)
    assert empty.status_code == 422 and empty.json()["detail"][0]["field"] == "text"
    bad = client.post(
        f"/api/experiments/{experiment.pk}/tags", json.dumps({"add": ["ok", "not ok"]}), **headers
    )
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "add.1"


def test_tagging_many_runs_through_the_api_and_another_teams_runs(client, token, team, alice):
    experiment = make_finished_experiment(team, alice, seeds=(0, 1))
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}", "content_type": "application/json"}
    done = client.post("/api/runs/tags", json.dumps({"q": "preset = grpo", "add": ["g"]}), **headers).json()
    assert done == {"runs": 4, "added": 4, "removed": 0}
    again = client.post("/api/runs/tags", json.dumps({"q": "preset = grpo", "add": ["g"]}), **headers).json()
    assert again == {"runs": 4, "added": 0, "removed": 0}, "a tag a run has is not added twice"
    bad = client.post("/api/runs/tags", json.dumps({"q": "preset = ", "add": ["g"]}), **headers)
    assert bad.status_code == 422 and bad.json()["detail"][0]["position"] == 9
    bob = new_team_member("bob", "team-b")
    other = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(bob)}", "content_type": "application/json"}
    run = experiment.runs.first()
    refused = client.post("/api/runs/tags", json.dumps({"runs": [run.pk], "add": ["x"]}), **other)
    assert refused.status_code == 422 and "in your teams" in refused.json()["detail"][0]["msg"]
    assert client.post(f"/api/runs/{run.pk}/notes", json.dumps({"text": "hi"}), **other).status_code == 404
    assert (
        client.post(f"/api/experiments/{experiment.pk}/tags", json.dumps({"add": ["x"]}), **other).status_code
        == 404
    )
    assert not Note.objects.exists() and not ExperimentTag.objects.exists()
    assert client.get("/api/views", **other).json() == {"views": []}


def test_saved_views_through_the_api(client, token, team, alice):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}", "content_type": "application/json"}
    saved = client.post(
        "/api/views", json.dumps({"name": "m2po stale", "query": "algorithm.preset = m2po"}), **headers
    )
    assert saved.status_code == 201 and saved.json()["team"] == team.pk
    bad = client.post("/api/views", json.dumps({"name": "broken", "query": "seed >"}), **headers)
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "query"
    listed = client.get("/api/views", **headers).json()["views"]
    assert [v["name"] for v in listed] == ["m2po stale"]
    assert client.delete(f"/api/views/{listed[0]['id']}", **headers).json() == {"view": listed[0]["id"]}
