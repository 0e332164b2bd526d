"""The API's imports: a prime-rl file uploaded as multipart/form-data becomes a run (201), the same
file again changes nothing (200, `created` false), another team's experiment is a 404, a damaged
file a 422 naming the file and line, an oversized one a 413 with nothing left on disk; the tools
and their mappings are listed; an imported run says so in the runs list and refuses cancel and
retry."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.management import call_command
from import_helpers import Api, prime_rl_file
from sample_experiments import make_finished_experiment
from support import new_team_member

from experiments.models import MetricChunk, Run
from imports.models import Import

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(client, token):
    return Api(client, token)


@pytest.fixture
def experiment(team, alice):
    return make_finished_experiment(team, alice, name="grid", presets=("grpo",), staleness=({},), seeds=(0,))


PLACED = {"tool": "prime-rl", "preset": "reinforce", "staleness": "on-policy", "seed": "4"}


def uploads_left() -> list:
    return list(settings.FILE_UPLOAD_TEMP_DIR.iterdir()) + [
        p for p in settings.LAB_IMPORTS_DIR.iterdir() if p != settings.FILE_UPLOAD_TEMP_DIR
    ]


def test_an_upload_imports_once(api, experiment, tmp_path):
    path = prime_rl_file(tmp_path / "metrics.jsonl", seed=4)
    made = api.upload(experiment.pk, path, **PLACED, map=["eval/acc=eval/accuracy", "progress/tokens=tokens"])
    assert made.status_code == 201, made.content
    body = made.json()
    record = Import.objects.get()
    assert body["created"] and body["run"] == record.run_id and body["experiment"] == experiment.pk
    assert (body["preset"], body["staleness"], body["seed"], body["file_name"]) == (
        "reinforce",
        "on-policy",
        4,
        "metrics.jsonl",
    )
    assert body["mapping"]["progress/tokens"] == "tokens" and body["mapping"]["eval/acc"] == "eval/accuracy"
    assert body["imported_by"] == "alice" and body["sha256"] == record.sha256
    again = api.upload(experiment.pk, path, **{**PLACED, "seed": "9"})
    assert again.status_code == 200 and again.json() == {**body, "created": False}
    assert Import.objects.count() == 1 and uploads_left() == []

    listed = api.call("get", f"/experiments/{experiment.pk}/runs").json()["items"]
    assert [(r["id"], r["imported"]) for r in listed] == [
        (r.pk, r.pk == record.run_id) for r in experiment.runs.order_by("pk")
    ]
    cancel = api.call("post", f"/runs/{record.run_id}/cancel")
    retry = api.call("post", f"/runs/{record.run_id}/retry")
    for refused, action in ((cancel, "cancelled"), (retry, "retried")):
        assert refused.status_code == 409
        assert refused.json()["detail"] == (
            f"run {record.run_id} was imported from prime-rl (metrics.jsonl) and is read-only: it cannot be {action}"
        )


def test_another_teams_experiment_is_a_404(client, experiment, tmp_path):
    new_team_member("bob", "team-b")
    import io

    out = io.StringIO()
    call_command("create_token", "bob", stdout=out)
    bob = Api(client, out.getvalue().strip())
    answer = bob.upload(experiment.pk, prime_rl_file(tmp_path / "metrics.jsonl"), **PLACED)
    assert answer.status_code == 404
    assert not Import.objects.exists() and uploads_left() == []


def test_a_damaged_file_is_a_422_naming_the_file_and_line(api, experiment, tmp_path):
    path = prime_rl_file(tmp_path / "run-7.jsonl")
    lines = path.read_text().splitlines(keepends=True)
    lines[4] = "{not json}\n"
    path.write_text("".join(lines))
    chunks = MetricChunk.objects.count()
    answer = api.upload(experiment.pk, path, **PLACED)
    assert answer.status_code == 422
    (error,) = answer.json()["detail"]
    assert error["field"] == "file" and error["loc"] == ["body", "file"]
    assert error["msg"].startswith("run-7.jsonl, line 5: not JSON"), error
    assert Run.objects.count() == 1 and MetricChunk.objects.count() == chunks and uploads_left() == []


def test_an_oversized_upload_is_a_413_and_nothing_stays_on_disk(api, experiment, tmp_path, settings):
    path = prime_rl_file(tmp_path / "metrics.jsonl")
    settings.LAB_IMPORT_MAX_BYTES = 1000
    answer = api.upload(experiment.pk, path, **PLACED)
    assert answer.status_code == 413
    assert answer.json()["detail"] == (
        "metrics.jsonl is more than 1,000 bytes, the most an import may be (LAB_IMPORT_MAX_BYTES)"
    )
    assert not Import.objects.exists() and uploads_left() == []


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"preset": "grpo", "staleness": "on-policy", "seed": "0"}, "tool", "Field required"),
        ({**PLACED, "seed": "many"}, "seed", "valid integer"),
        ({**PLACED, "staleness": "sync_offset=x"}, "staleness", "'sync_offset=x' is not a staleness cell"),
    ],
)
def test_bad_fields_are_422s_naming_the_field(api, experiment, tmp_path, fields, field, words):
    answer = api.upload(experiment.pk, prime_rl_file(tmp_path / "metrics.jsonl"), **fields)
    assert answer.status_code == 422
    (error,) = answer.json()["detail"]
    assert error["field"] == field and words in error["msg"], error
    assert not Import.objects.exists()


def test_no_file_is_a_422(api, experiment):
    answer = api.client.post(f"/api/experiments/{experiment.pk}/imports", PLACED, **api.headers)
    assert answer.status_code == 422 and answer.json()["detail"][0]["field"] == "file"


def test_the_tools_and_their_mappings_are_listed(api):
    answer = api.call("get", "/imports/tools").json()
    tools = {t["tool"]: t["mapping"] for t in answer["tools"]}
    assert tools["prime-rl"]["loss/mean"] == "loss" and answer["max_bytes"] == settings.LAB_IMPORT_MAX_BYTES
