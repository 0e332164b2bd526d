"""The OpenAPI schema at /api/openapi.json describes the API completely: a sweep's `config` is
RunConfig's schema and its `staleness` settings StalenessCell's (a schedule or an async cell), every operation lists its
status codes with a schema for each, and the error bodies the API really sends have the
declared shapes."""

from __future__ import annotations

import pytest
from support import queue_sweep

from accounts.models import ApiToken, Membership, Team
from experiments.models import Run
from rlcore.config import RunConfig, StalenessCell

pytestmark = pytest.mark.django_db

# Every operation: its success status and its error statuses (401 everywhere: a token is needed).
OPERATIONS = {
    ("post", "/api/sweeps"): {201, 401, 422},
    ("get", "/api/experiments"): {200, 401, 422},
    ("post", "/api/experiments/{experiment_id}/cancel"): {200, 401, 404, 422},
    ("post", "/api/experiments/{experiment_id}/seeds"): {201, 401, 404, 422},
    ("post", "/api/experiments/{experiment_id}/archive"): {200, 401, 404, 422},
    ("post", "/api/experiments/{experiment_id}/unarchive"): {200, 401, 404, 422},
    ("delete", "/api/experiments/{experiment_id}"): {200, 401, 403, 404, 409, 422},
    ("get", "/api/experiments/{experiment_id}/runs"): {200, 401, 404, 422},
    ("get", "/api/runs/{run_id}"): {200, 401, 404, 422},
    ("get", "/api/runs/{run_id}/metrics"): {200, 401, 404, 422},
    ("get", "/api/experiments/{experiment_id}/compare"): {200, 401, 404, 422},
    ("get", "/api/compare"): {200, 401, 422},
    ("get", "/api/runs"): {200, 401, 422},
    ("post", "/api/runs/tags"): {200, 401, 422},
    ("post", "/api/runs/{run_id}/notes"): {201, 401, 404, 422},
    ("post", "/api/experiments/{experiment_id}/notes"): {201, 401, 404, 422},
    ("post", "/api/experiments/{experiment_id}/tags"): {200, 401, 404, 422},
    ("delete", "/api/notes/{note_id}"): {200, 401, 403, 404, 422},
    ("get", "/api/views"): {200, 401, 422},
    ("post", "/api/views"): {201, 401, 404, 422},
    ("delete", "/api/views/{view_id}"): {200, 401, 404, 422},
    ("post", "/api/claims"): {201, 401, 404, 422},
    ("get", "/api/claims"): {200, 401, 422},
    ("get", "/api/claims/{claim_id}"): {200, 401, 404},
    ("delete", "/api/claims/{claim_id}"): {200, 401, 403, 404},
    ("get", "/api/claim-templates"): {200, 401},
    ("get", "/api/reports"): {200, 401},
    ("post", "/api/reports"): {201, 401, 404, 422},
    ("get", "/api/reports/{report_id}"): {200, 401, 404},
    ("put", "/api/reports/{report_id}"): {200, 401, 403, 404, 422},
    ("delete", "/api/reports/{report_id}"): {200, 401, 403, 404},
    ("post", "/api/reports/{report_id}/publish"): {201, 401, 403, 404, 422},
    ("get", "/api/reports/{report_id}/current"): {200, 401, 404, 409},
    ("get", "/api/reports/{report_id}/export.html"): {200, 401, 404, 409},
    ("get", "/api/reports/{report_id}/export-csv.zip"): {200, 401, 404, 409},
    ("post", "/api/runs/{run_id}/archive"): {200, 401, 404, 409, 422},
    ("post", "/api/runs/{run_id}/unarchive"): {200, 401, 404, 409, 422},
    ("post", "/api/runs/{run_id}/cancel"): {200, 401, 404, 409, 422},
    ("post", "/api/runs/{run_id}/retry"): {200, 401, 404, 409, 422},
    ("get", "/api/imports/tools"): {200, 401},
    ("post", "/api/experiments/{experiment_id}/imports"): {200, 201, 401, 404, 413, 422},
}


# Operations that answer a file, not JSON: its media type.
FILES = {
    ("get", "/api/reports/{report_id}/export.html"): "text/html",
    ("get", "/api/reports/{report_id}/export-csv.zip"): "application/zip",
}


@pytest.fixture
def schema(client) -> dict:
    return client.get("/api/openapi.json").json()


def component(schema: dict, ref: str) -> dict:
    prefix = "#/components/schemas/"
    assert ref.startswith(prefix), ref
    return schema["components"]["schemas"][ref.removeprefix(prefix)]


def referenced(schema: dict, prop: dict) -> dict:
    """The component a property refers to (`$ref`, or `allOf: [$ref]` when it has a default)."""
    return component(schema, prop["$ref"] if "$ref" in prop else prop["allOf"][0]["$ref"])


def json_schema_of(schema: dict, operation: dict, status: int) -> dict:
    return operation["responses"][str(status)]["content"]["application/json"]["schema"]


def conforms(schema: dict, body, declared: dict) -> bool:
    """`body` has exactly the declared object's properties, with strings and arrays where it says so
    (enough for the flat error bodies)."""
    if "$ref" in declared:
        declared = component(schema, declared["$ref"])
    if declared.get("type") == "string":
        return isinstance(body, str)
    if declared.get("type") == "array":
        return isinstance(body, list) and all(conforms(schema, item, declared["items"]) for item in body)
    if declared.get("type") == "object":
        return (
            isinstance(body, dict)
            and set(declared.get("required", [])) <= set(body) <= set(declared["properties"])
            and all(conforms(schema, body[k], declared["properties"][k]) for k in body)
        )
    return True  # unions of scalars (loc's str | int) are not checked further


def test_config_is_run_configs_schema_and_staleness_is_typed(schema):
    sweep = component(schema, "#/components/schemas/SweepIn")["properties"]
    run_config = referenced(schema, sweep["config"])
    assert run_config["title"] == "RunConfig"
    assert set(run_config["properties"]) == set(RunConfig.model_fields)
    assert run_config["properties"]["steps"] == {
        **run_config["properties"]["steps"],
        "type": "integer",
        "minimum": 1,
        "maximum": 100000,
    }
    rollout = referenced(schema, run_config["properties"]["rollout"])
    assert {"group_size", "prompts_per_step", "max_new_tokens"} <= set(rollout["properties"])
    assert run_config["additionalProperties"] is False

    staleness = component(schema, sweep["staleness"]["items"]["$ref"])
    assert (
        set(staleness["properties"])
        == set(StalenessCell.model_fields)
        == {"sync_interval", "sync_offset", "offline", "mode", "max_staleness"}
    )
    assert staleness["properties"]["offline"]["type"] == "boolean"
    modes = [option for option in staleness["properties"]["mode"]["anyOf"] if option.get("type") != "null"]
    assert modes == [{"type": "string", "enum": ["simulated", "distributed", "async"]}]

    detail = component(schema, "#/components/schemas/RunDetailOut")["properties"]
    assert referenced(schema, detail["config"]) is run_config
    assert detail["collapsed"]["anyOf"] == [{"type": "boolean"}, {"type": "null"}]


def test_every_operation_declares_its_status_codes_with_schemas(schema):
    found = {
        (method, path): {int(status) for status in operation["responses"]}
        for path, item in schema["paths"].items()
        for method, operation in item.items()
    }
    assert found == OPERATIONS
    for (method, path), statuses in OPERATIONS.items():
        operation = schema["paths"][path][method]
        for status in statuses:
            if (method, path) in FILES and status == 200:
                content = operation["responses"]["200"]["content"]
                assert content == {FILES[method, path]: {"schema": {"type": "string", "format": "binary"}}}
                continue
            declared = json_schema_of(schema, operation, status)
            if status == 422:
                assert declared == {"$ref": "#/components/schemas/ValidationErrorOut"}, (path, status)
            elif status >= 400:
                assert declared == {"$ref": "#/components/schemas/ErrorOut"}, (path, status)
            else:
                assert component(schema, declared["$ref"])["properties"], (path, status)
    metrics = schema["paths"]["/api/runs/{run_id}/metrics"]["get"]["responses"]["200"]["content"]
    assert set(metrics) == {"application/json", "text/csv"}
    comparison = component(schema, "#/components/schemas/ComparisonOut")["properties"]
    assert {"groups", "summary", "throughput", "runs", "drops", "robustness", "ties", "findings"} <= set(
        comparison
    )
    runs = component(schema, comparison["runs"]["items"]["$ref"])["properties"]
    assert {"kl/init", "reward/mean", "collapsed", "final"} <= set(runs)


def test_the_error_bodies_sent_have_the_declared_shapes(client, schema, team, alice, django_user_model):
    run = queue_sweep(team, alice, "e").runs.get()
    member = django_user_model.objects.create_user("carol")
    Membership.objects.create(team=team, user=member)
    Team.objects.create(name="elsewhere")
    admin = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(alice)}"}
    plain = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(member)}"}
    experiment = f"/api/experiments/{run.experiment_id}"
    answers = [
        ("get", "/api/experiments", {}, {}, 401),
        ("get", "/api/runs/999999", {}, admin, 404),
        ("get", "/api/runs/not-a-number", {}, admin, 422),
        ("get", "/api/experiments", {"limit": 0}, admin, 422),
        ("delete", experiment, {}, plain, 403),
        ("delete", experiment, {}, admin, 409),
        ("post", f"/api/runs/{run.pk}/retry", {}, admin, 409),
        ("post", f"/api/runs/{run.pk}/archive", {}, admin, 409),
        ("get", "/api/reports/999999", {}, admin, 404),
        ("get", "/api/compare", {"runs": "x"}, admin, 422),
    ]
    for method, url, query, auth, status in answers:
        response = getattr(client, method)(url, query, **auth)
        assert response.status_code == status, (url, response.content)
        path = next(
            p
            for (m, p) in OPERATIONS
            if m == method and _matches(p, url.split("?")[0]) and status in OPERATIONS[(m, p)]
        )
        declared = json_schema_of(schema, schema["paths"][path][method], status)
        assert conforms(schema, response.json(), declared), (url, response.json())
    sweep = client.post(
        "/api/sweeps",
        {"name": "x", "team": "elsewhere", "presets": []},
        content_type="application/json",
        **admin,
    )
    assert sweep.status_code == 422
    declared = json_schema_of(schema, schema["paths"]["/api/sweeps"]["post"], 422)
    assert conforms(schema, sweep.json(), declared) and {d["field"] for d in sweep.json()["detail"]} == {
        "team",
        "presets",
    }
    assert Run.objects.get(pk=run.pk).status == Run.QUEUED


def _matches(template: str, url: str) -> bool:
    parts, wanted = template.split("/"), url.split("/")
    return len(parts) == len(wanted) and all(
        p == w or p.startswith("{") for p, w in zip(parts, wanted, strict=True)
    )
