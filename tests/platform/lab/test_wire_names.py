"""What other programs and pages rely on stays put when the code moves: the OpenAPI document
(paths, operation ids, bodies, status codes), the URL names and paths, and the Celery task and
queue names. A change to any of them must be meant: regenerate the snapshot with
`LAB_UPDATE_SNAPSHOTS=1 python -m pytest tests/platform/lab/test_wire_names.py` and say why in the commit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

pytestmark = pytest.mark.django_db

SNAPSHOT = Path(__file__).with_name("openapi-snapshot.json")

OPERATION_IDS = {
    ("post", "/api/sweeps"): "experiments_api_submit_sweep",
    ("get", "/api/experiments"): "experiments_api_list_experiments",
    ("post", "/api/experiments/{experiment_id}/cancel"): "experiments_api_cancel_experiment",
    ("post", "/api/experiments/{experiment_id}/seeds"): "experiments_api_add_seeds",
    ("post", "/api/experiments/{experiment_id}/archive"): "experiments_api_archive_experiment",
    ("post", "/api/experiments/{experiment_id}/unarchive"): "experiments_api_unarchive_experiment",
    ("delete", "/api/experiments/{experiment_id}"): "experiments_api_delete_experiment",
    ("get", "/api/experiments/{experiment_id}/runs"): "experiments_api_list_runs",
    ("get", "/api/runs/{run_id}"): "experiments_api_get_run",
    ("get", "/api/runs/{run_id}/metrics"): "experiments_api_get_metrics",
    ("get", "/api/experiments/{experiment_id}/compare"): "experiments_api_compare_experiment",
    ("get", "/api/compare"): "experiments_api_compare_runs",
    ("get", "/api/runs"): "experiments_api_search_runs",
    ("post", "/api/runs/tags"): "experiments_api_tag_runs",
    ("post", "/api/runs/{run_id}/notes"): "experiments_api_note_run",
    ("post", "/api/experiments/{experiment_id}/notes"): "experiments_api_note_experiment",
    ("post", "/api/experiments/{experiment_id}/tags"): "experiments_api_tag_experiment",
    ("delete", "/api/notes/{note_id}"): "experiments_api_delete_note",
    ("get", "/api/views"): "experiments_api_list_views",
    ("post", "/api/views"): "experiments_api_save_view",
    ("delete", "/api/views/{view_id}"): "experiments_api_delete_view",
    ("post", "/api/claims"): "dashboards_api_state_claim",
    ("get", "/api/claims"): "dashboards_api_list_claims",
    ("get", "/api/claims/{claim_id}"): "dashboards_api_get_claim",
    ("delete", "/api/claims/{claim_id}"): "dashboards_api_delete_claim",
    ("get", "/api/claim-templates"): "dashboards_api_claim_templates",
    ("get", "/api/reports"): "dashboards_api_list_reports",
    ("post", "/api/reports"): "dashboards_api_create_report",
    ("get", "/api/reports/{report_id}"): "dashboards_api_get_report",
    ("put", "/api/reports/{report_id}"): "dashboards_api_edit_report",
    ("delete", "/api/reports/{report_id}"): "dashboards_api_delete_report",
    ("post", "/api/reports/{report_id}/publish"): "dashboards_api_publish_report",
    ("get", "/api/reports/{report_id}/current"): "dashboards_api_report_current",
    ("get", "/api/reports/{report_id}/export.html"): "dashboards_api_export_report_html",
    ("get", "/api/reports/{report_id}/export-csv.zip"): "dashboards_api_export_report_csv",
    ("post", "/api/runs/{run_id}/archive"): "experiments_api_archive_run",
    ("post", "/api/runs/{run_id}/unarchive"): "experiments_api_unarchive_run",
    ("post", "/api/runs/{run_id}/cancel"): "experiments_api_cancel_run",
    ("post", "/api/runs/{run_id}/retry"): "experiments_api_retry_run",
    ("get", "/api/imports/tools"): "imports_api_list_tools",
    ("post", "/api/experiments/{experiment_id}/imports"): "imports_api_import_run",
}

URLS = {
    "home": "",
    "health": "health",
    "login": "login/",
    "logout": "logout/",
    "experiment-list": "experiments/",
    "submit-sweep": "experiments/new/",
    "experiment-detail": "experiments/<int:experiment_id>/",
    "experiment-cancel": "experiments/<int:experiment_id>/cancel/",
    "experiment-archive": "experiments/<int:experiment_id>/archive/",
    "experiment-unarchive": "experiments/<int:experiment_id>/unarchive/",
    "experiment-seeds": "experiments/<int:experiment_id>/seeds/",
    "experiment-delete": "experiments/<int:experiment_id>/delete/",
    "experiment-save-template": "experiments/<int:experiment_id>/save-template/",
    "experiment-runs-live": "experiments/<int:experiment_id>/live/",
    "experiment-compare": "experiments/<int:experiment_id>/compare/",
    "experiment-compare-data": "experiments/<int:experiment_id>/compare/data",
    "experiment-compare-summary": "experiments/<int:experiment_id>/compare/summary",
    "run-list": "runs/",
    "runs-compare": "compare/",
    "runs-compare-data": "compare/data",
    "runs-compare-summary": "compare/summary",
    "run-detail": "runs/<int:run_id>/",
    "run-live": "runs/<int:run_id>/live/",
    "run-curves": "runs/<int:run_id>/curves",
    "runs-tag": "runs/tag",
    "run-notes": "runs/<int:run_id>/notes",
    "run-tags": "runs/<int:run_id>/tags",
    "experiment-notes": "experiments/<int:experiment_id>/notes",
    "experiment-tags": "experiments/<int:experiment_id>/tags",
    "note-delete": "notes/<int:note_id>/delete",
    "view-save": "runs/views/save",
    "view-delete": "runs/views/<int:view_id>/delete",
    "claims-data": "claims/data",
    "claim-new": "claims/new",
    "claim-detail": "claims/<int:claim_id>/",
    "claim-withdraw": "claims/<int:claim_id>/withdraw",
    "report-list": "reports/",
    "report-detail": "reports/<int:report_id>/",
    "report-edit": "reports/<int:report_id>/edit",
    "report-current": "reports/<int:report_id>/current",
    "report-export-html": "reports/<int:report_id>/export.html",
    "report-export-csv": "reports/<int:report_id>/export-csv.zip",
    "report-delete": "reports/<int:report_id>/delete",
    "run-metrics-csv": "runs/<int:run_id>/metrics.csv",
    "run-cancel": "runs/<int:run_id>/cancel/",
    "run-retry": "runs/<int:run_id>/retry/",
    "run-archive": "runs/<int:run_id>/archive/",
    "experiment-import": "experiments/<int:experiment_id>/import/",
    "api-tokens": "account/tokens/",
    "api-token-revoke": "account/tokens/<int:token_id>/revoke/",
    "team-list": "teams/",
    "team-detail": "teams/<int:team_id>/",
    "team-mirror": "teams/<int:team_id>/mirror/",
    "invitation-accept": "teams/invitations/<int:invitation_id>/accept/",
    "invitation-decline": "teams/invitations/<int:invitation_id>/decline/",
    "invitation-revoke": "teams/<int:team_id>/invitations/<int:invitation_id>/revoke/",
    "team-remove-member": "teams/<int:team_id>/members/<int:membership_id>/remove/",
    "alert-target-add": "teams/<int:team_id>/alerts/targets/",
    "alert-target-remove": "teams/<int:team_id>/alerts/targets/<int:target_id>/remove/",
    "alert-target-test": "teams/<int:team_id>/alerts/targets/<int:target_id>/test/",
}

TASKS = {"workers.tasks.execute_run", "workers.tasks.generate_batch"}


def page_urls() -> dict[str, str]:
    """Every named URL outside the admin and the API, with its path."""
    out = {}

    def walk(patterns, prefix: str) -> None:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                if str(pattern.pattern) not in ("admin/", "api/"):
                    walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern) and pattern.name:
                out[pattern.name] = prefix + str(pattern.pattern)

    walk(get_resolver().url_patterns, "")
    return out


@pytest.fixture
def schema(client) -> dict:
    return client.get("/api/openapi.json").json()


def test_the_openapi_operation_ids_are_pinned(schema):
    found = {
        (method, path): op["operationId"]
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
    }
    assert found == OPERATION_IDS


def test_the_openapi_document_is_the_snapshot(schema):
    if os.environ.get("LAB_UPDATE_SNAPSHOTS"):
        SNAPSHOT.write_text(json.dumps(schema, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    assert schema == json.loads(SNAPSHOT.read_text()), "the API changed: see the module docstring"


def test_url_names_and_paths_are_pinned():
    assert page_urls() == URLS


def test_celery_task_and_queue_names_are_pinned():
    import workers.tasks  # noqa: F401  (registers the tasks)
    from lab.celery import app

    assert set(app.tasks) >= TASKS
    from rlcore.config import RunConfig

    queues = {RunConfig.model_validate({"device": d}).queue for d in ("cpu", "cuda")}
    rollout = {
        RunConfig.model_validate(
            {"execution": {"mode": "distributed"}, "rollout": {"engine": e}, **extra}
        ).rollout_queue
        for e, extra in (("hf", {}), ("vllm", {"device": "cuda"}))
    }
    assert (queues, rollout) == ({"cpu", "gpu"}, {"rollout", "rollout-gpu"})
