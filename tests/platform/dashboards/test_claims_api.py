"""Claims through the API: stated on an experiment or a selection, their verdicts from the runs,
pre-registration, templates that give the findings panel's verdicts, field errors, and teams."""

import json

import pytest
from sample_experiments import make_finished_experiment
from support import new_team_member

from dashboards.models import Claim
from experiments.models import Run


@pytest.fixture
def api(client, token):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}

    class Api:
        def post(self, path, body):
            return client.post(f"/api{path}", json.dumps(body), content_type="application/json", **headers)

        def get(self, path):
            return client.get(f"/api{path}", **headers)

        def delete(self, path):
            return client.delete(f"/api{path}", **headers)

    return Api()


def holds(experiment, x="grpo", setting="sync_offset=2", **extra):
    return {"experiment": experiment.pk, "parts": [{"kind": "holds", "x": x}], "settings": [setting], **extra}


def test_a_claim_is_stated_and_tested_on_an_experiment(api, demo):
    response = api.post("/claims", holds(demo, title="GRPO holds at offset 2"))
    assert response.status_code == 201, response.content
    claim = response.json()
    assert claim["verdict"] == "support" and claim["title"] == "GRPO holds at offset 2"
    (row,) = claim["by_setting"][0]["parts"]
    assert (row["estimate"], row["n"], row["paired"], row["test"]) == (-0.005, 3, True, "paired t")
    assert claim["confidence"] == pytest.approx(0.9) and not claim["holm"] and claim["tests"] == 1
    assert claim["author"] == "alice" and not claim["pre_registered"], "its runs had finished"
    assert "grpo stays within δ = 0.02 of its on-policy value at sync_offset=2" in claim["statement"]
    assert api.get(f"/claims/{claim['id']}").json()["verdict"] == "support"
    listed = api.get(f"/claims?experiment={demo.pk}").json()["claims"]
    assert [c["id"] for c in listed] == [claim["id"]]
    against = api.post("/claims", holds(demo, x="reinforce", settings=["sync_offset=2", "offline"])).json()
    assert against["verdict"] == "contradict" and against["holm"] and against["tests"] == 2


def test_a_claim_stated_before_its_runs_finished_is_pre_registered_and_provisional(api, demo):
    Run.objects.filter(experiment=demo).update(status=Run.RUNNING, finished=None)
    claim = api.post("/claims", holds(demo)).json()
    assert claim["pre_registered"] and claim["provisional"]
    assert (claim["runs_active"], claim["runs_total"]) == (6, 6)


def test_the_papers_templates_give_the_findings_panels_verdicts(api, demo, alice_client):
    panel = alice_client.get(f"/experiments/{demo.pk}/compare/data?metric=eval/accuracy").json()["findings"]
    templates = api.get("/claim-templates").json()["templates"]
    assert [t["name"] for t in templates] == [f["template"] for f in panel]
    for template, finding in zip(templates, panel, strict=True):
        claim = api.post("/claims", {"experiment": demo.pk, "template": template["name"]}).json()
        assert claim["verdict"] == finding["verdict"] == "support", claim
        assert claim["template"] == template["name"] and claim["title"] == finding["claim"]


def test_a_template_the_runs_cannot_state_names_what_they_lack(api, team, alice):
    experiment = make_finished_experiment(team, alice, seeds=(0, 1))  # reinforce, grpo
    response = api.post("/claims", {"experiment": experiment.pk, "template": "on-policy-coincide"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["field"] == "template"
    assert "rec-oneside-nois" in response.json()["detail"][0]["msg"]


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"parts": []}, "parts", "1 to 20"),
        ({"parts": [{"kind": "wins", "x": "grpo"}]}, "parts.0.kind", "holds, degrades, beats, equivalent"),
        ({"parts": [{"kind": "holds", "x": "ppo"}]}, "parts.0.x", "lines: reinforce, grpo"),
        ({"parts": [{"kind": "beats", "x": "grpo"}]}, "parts.0.y", "another line y"),
        ({"parts": [{"kind": "beats", "x": "grpo", "y": "grpo"}]}, "parts.0.y", "another line"),
        ({"settings": ["sync_offset=9"]}, "settings.0", "on-policy, sync_offset=2, offline"),
        ({"settings": []}, "settings", "1 to 20"),
        ({"quantifier": "most"}, "quantifier", "every or some"),
        ({"alpha": 0.6}, "alpha", "at most 0.25"),
        ({"delta": -1}, "delta", "from 0"),
        ({"rule": "median"}, "rule", "last, mean_last_k"),
        ({"experiment": None}, "experiment", "one of them"),
    ],
)
def test_bad_claims_are_422s_naming_the_field(api, demo, change, field, words):
    response = api.post("/claims", holds(demo) | change)
    assert response.status_code == 422, response.content
    (error,) = response.json()["detail"]
    assert error["field"] == field and words in error["msg"], error
    assert not Claim.objects.exists()


def test_a_claim_on_a_selection_of_runs_of_two_experiments(api, team, alice):
    first = make_finished_experiment(
        team, alice, name="first", presets=("reinforce", "grpo"), seeds=(0, 1, 2)
    )
    second = make_finished_experiment(team, alice, name="second", presets=("reinforce",), seeds=(0, 1, 2))
    ids = list(first.runs.values_list("pk", flat=True)) + list(second.runs.values_list("pk", flat=True))
    x, y = f"grpo · #{first.pk} first", f"reinforce · #{second.pk} second"
    body = {
        "runs": ids,
        "parts": [{"kind": "beats", "x": x, "y": y}],
        "settings": ["on-policy"],
        "delta": 0.0,
    }
    claim = api.post("/claims", body).json()
    assert claim["experiment"] is None and claim["runs"] == sorted(ids)
    # grpo (the first experiment's second preset) ends 0.05 above the second's reinforce at every seed.
    assert claim["verdict"] == "support", claim
    assert claim["by_setting"][0]["parts"][0]["estimate"] == 0.05
    same = body | {"parts": [{"kind": "beats", "x": f"reinforce · #{first.pk} first", "y": y}]}
    assert api.post("/claims", same).json()["verdict"] == "contradict", "the same numbers: not ahead"


def test_other_teams_claims_do_not_exist_for_you(api, demo, client):
    claim = api.post("/claims", holds(demo)).json()
    bob = new_team_member("bob", "team-b")
    from accounts.models import ApiToken

    other = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(bob)}"}
    assert client.get(f"/api/claims/{claim['id']}", **other).status_code == 404
    assert client.delete(f"/api/claims/{claim['id']}", **other).status_code == 404
    assert client.get("/api/claims", **other).json() == {"claims": []}
    body = json.dumps(holds(demo))
    assert client.post("/api/claims", body, content_type="application/json", **other).status_code == 404
    runs = json.dumps(holds(demo) | {"experiment": None, "runs": [demo.runs.first().pk]})
    refused = client.post("/api/claims", runs, content_type="application/json", **other)
    assert refused.status_code == 422 and "in your teams" in refused.json()["detail"][0]["msg"]


def test_a_claim_is_withdrawn_by_its_author(api, demo):
    claim = api.post("/claims", holds(demo)).json()
    assert api.delete(f"/claims/{claim['id']}").json() == {"claim": claim["id"]}
    assert api.get(f"/claims/{claim['id']}").status_code == 404
