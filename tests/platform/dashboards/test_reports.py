"""Reports: blocks parsed from Markdown, publishing freezes their numbers (unchanged after a run is
added and one archived; the current-data view shows both), versions, the CSV bundle, sanitised
prose, cited runs kept from deletion, and other teams' reports as 404s on every page and API path."""

import csv
import io
import json
import uuid
import zipfile

import pytest
from dashboard_helpers import MALICIOUS
from sample_experiments import make_finished_experiment
from support import log_points, new_team_member

from dashboards.models import Report, ReportRun
from dashboards.reports import service
from experiments import packing, series
from experiments.models import Run


@pytest.fixture
def api(client, token):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}

    class Api:
        def call(self, method, path, body=None):
            kwargs = {} if body is None else {"data": json.dumps(body), "content_type": "application/json"}
            return getattr(client, method)(f"/api{path}", **kwargs, **headers)

    return Api()


def source(demo, claim_id=None):
    lines = [
        "# Staleness and GRPO",
        "",
        "GRPO *holds* at offset 2.",
        "",
        f"{{{{ chart /experiments/{demo.pk}/compare/?metric=eval/accuracy }}}}",
        "",
        f"{{{{ table http://testserver/experiments/{demo.pk}/compare/?metric=eval/accuracy&rule=last }}}}",
    ]
    if claim_id is not None:
        lines += ["", f"{{{{ claim /claims/{claim_id}/ }}}}"]
    return "\n".join(lines)


def add_seed(run: Run, seed: int, shift: float) -> Run:
    """A copy of `run` as another seed, every point of it `shift` higher."""
    copy = Run.objects.get(pk=run.pk)
    copy.pk, copy.key, copy.seed = None, uuid.uuid4(), seed
    copy.config = {**copy.config, "seed": seed}
    copy.save()
    log_points(
        copy,
        [
            (name, step, value + shift, packing.wall_time(us))
            for name, (steps, values, times) in series.points_of(run.pk)
            for step, value, us in zip(steps.tolist(), values.tolist(), times.tolist(), strict=True)
        ],
    )
    return copy


def cell(blocks, kind, preset, staleness):
    (block,) = [b for b in blocks if b["kind"] == kind]
    (row,) = [r for r in block["data"]["summary"] if r["preset"] == preset and r["staleness"] == staleness]
    return row


def test_a_published_report_reads_the_same_after_a_run_is_added_and_one_archived(api, demo):
    claim = api.call(
        "post",
        "/claims",
        {"experiment": demo.pk, "parts": [{"kind": "holds", "x": "grpo"}], "settings": ["sync_offset=2"]},
    ).json()
    made = api.call(
        "post", "/reports", {"title": "Offset 2", "source": source(demo, claim["id"]), "publish": True}
    )
    assert made.status_code == 201, made.content
    report = made.json()
    frozen = report["version"]["blocks"]
    assert [b["kind"] for b in frozen] == ["chart", "table", "claim"]
    assert frozen[1]["link"] == f"/experiments/{demo.pk}/compare/?metric=eval/accuracy&rule=last"
    assert len(frozen[0]["run_ids"]) == 36 and frozen[2]["claim"]["verdict"] == "support"
    statistics = frozen[1]["data"]["statistics"]["cells"][0]["iqm"]
    assert (statistics["method"], statistics["reps"], statistics["seed"]) == (
        "stratified percentile bootstrap",
        10_000,
        0,
    )
    before = cell(frozen, "table", "grpo", "on-policy")
    assert before["n_seeds"] == 3

    grpo = Run.objects.filter(experiment=demo, preset="grpo", staleness="on-policy").order_by("seed")
    added = add_seed(grpo[0], seed=3, shift=0.3)
    archived = grpo[1]
    assert api.call("post", f"/runs/{archived.pk}/archive").status_code == 200

    again = api.call("get", f"/reports/{report['id']}").json()["version"]["blocks"]
    assert again == frozen, "a published version's numbers never change"
    page = api_page(api, report["id"])
    assert f"{before['value']:.4f}" in page

    now = api.call("get", f"/reports/{report['id']}/current").json()
    chart, table, claimed = now["blocks"]
    assert table["changed"] and table["added"] == [added.pk] and table["archived"] == [archived.pk]
    assert table["deleted"] == [] and chart["added"] == [added.pk]
    (row,) = [r for r in table["cells"] if r["line"] == "grpo" and r["staleness"] == "on-policy"]
    assert row["changed"] and row["then"]["value"] == before["value"] and row["now"]["n_seeds"] == 3
    assert row["now"]["value"] != before["value"]
    unchanged = [r for r in table["cells"] if r["line"] == "reinforce"]
    assert unchanged and not any(r["changed"] for r in unchanged)
    assert claimed["kind"] == "claim" and claimed["added"] == [added.pk]
    assert claimed["archived"] == [archived.pk]


def api_page(api, report_id):
    from django.test import Client

    from dashboards.models import Report

    client = Client()
    client.force_login(Report.objects.get(pk=report_id).author)
    response = client.get(f"/reports/{report_id}/")
    assert response.status_code == 200
    return response.content.decode()


def test_the_current_data_page_marks_what_changed(alice_client, alice, demo):
    report = Report.objects.create(team=demo.team, author=alice, title="t", source=source(demo))
    version = service.publish(report, alice)
    run = Run.objects.filter(experiment=demo, preset="grpo", staleness="offline").first()
    run.set_archived(True)
    page = alice_client.get(f"/reports/{report.pk}/current?version={version.number}").content.decode()
    assert f'Archived since: <span class="archived">{run.pk}</span>' in page
    assert 'data-line="grpo" data-staleness="offline" data-changed="true"' in page
    assert 'data-line="reinforce" data-staleness="offline" data-changed="false"' in page


def test_versions_are_kept_and_each_reads_as_it_was(alice_client, alice, demo):
    report = Report.objects.create(team=demo.team, author=alice, title="first", source=source(demo))
    service.publish(report, alice)
    service.save(report, "second", "Only prose now.")
    service.publish(report, alice)
    assert list(report.versions.values_list("number", "title")) == [(2, "second"), (1, "first")]
    latest = alice_client.get(f"/reports/{report.pk}/").content.decode()
    first = alice_client.get(f"/reports/{report.pk}/?version=1").content.decode()
    assert "Only prose now." in latest and 'class="report-chart"' not in latest
    assert 'class="report-chart"' in first and "version 1</strong>" in first
    assert alice_client.get(f"/reports/{report.pk}/?version=3").status_code == 404
    assert ReportRun.objects.filter(version__report=report).count() == 36, "v1 still cites its runs"


def test_blocks_with_mistakes_are_refused_naming_the_line(api, demo, alice):
    other = new_team_member("bob", "team-b").memberships.get().team
    foreign = make_finished_experiment(other, other.members.get(), seeds=(0,))
    cases = {
        "{{ graph /claims/1/ }}": "line 1: a block is one of chart, table, claim (got 'graph')",
        "text\n{{ chart /runs/3/ }}": "line 2: a chart block links a comparison",
        "{{ claim /experiments/1/compare/ }}": "line 1: a claim block links a claim's page",
        f"{{{{ table /experiments/{demo.pk}/compare/?rule=median }}}}": "line 1: rule must be one of",
        f"{{{{ chart /experiments/{foreign.pk}/compare/ }}}}": f"line 1: no experiment {foreign.pk} in team team-a",
        "{{ claim /claims/999999/ }}": "line 1: no claim 999999 in team team-a",
        "{{ table /compare/?runs=999999 }}": "line 1: no run 999999 in team team-a",
    }
    for text, message in cases.items():
        response = api.call("post", "/reports", {"title": "x", "source": text, "publish": True})
        assert response.status_code == 422, text
        (error,) = response.json()["detail"]
        assert error["field"] == "source" and error["msg"].startswith(message), (text, error)
    assert not Report.objects.filter(title="x", versions__isnull=False).exists()
    fenced = api.call(
        "post", "/reports", {"title": "code", "source": "```\n{{ graph x }}\n```", "publish": True}
    )
    assert fenced.status_code == 201, "a block inside a code fence is code, not a block"
    assert api.call("post", "/reports", {"title": " ", "source": ""}).json()["detail"][0]["field"] == "title"


def test_a_draft_with_a_mistake_keeps_its_text_and_says_what_is_wrong(alice_client, alice, demo):
    report = Report.objects.create(team=demo.team, author=alice, title="t")
    response = alice_client.post(
        f"/reports/{report.pk}/edit",
        {"title": "t", "source": "My text\n{{ chart /nowhere/ }}", "action": "save"},
    )
    assert response.status_code == 422
    page = response.content.decode()
    assert (
        "source: line 2: a chart block links a comparison" in page
        and "My text\n{{ chart /nowhere/ }}" in page
    )


def elements(html):
    """Every element of `html` as (tag, {attribute: value})."""
    from html.parser import HTMLParser

    found = []

    class Collect(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.append((tag, dict(attrs)))

    Collect().feed(html)
    return found


def test_prose_is_rendered_inert():
    html = service.prose_html(MALICIOUS)
    tags = elements(html)
    assert {tag for tag, _ in tags} == {"p", "a"}, "no script, img or raw a element"
    assert [attrs for tag, attrs in tags if tag == "a"] == [
        {"href": "https://example.org/page", "rel": "noopener noreferrer nofollow"}
    ], "the javascript: link is no link"
    assert not [name for _, attrs in tags for name in attrs if name.startswith("on")]
    assert "&lt;script&gt;" in html, "raw HTML is shown as text"


def test_the_csv_bundle_holds_each_blocks_numbers(alice_client, alice, demo):
    report = Report.objects.create(team=demo.team, author=alice, title="t", source=source(demo))
    version = service.publish(report, alice)
    response = alice_client.get(f"/reports/{report.pk}/export-csv.zip")
    assert response["Content-Type"] == "application/zip"
    bundle = zipfile.ZipFile(io.BytesIO(response.content))
    assert sorted(bundle.namelist()) == [
        "block-1-chart-curves.csv",
        "block-1-chart-runs.csv",
        "block-1-chart-summary.csv",
        "block-2-table-runs.csv",
        "block-2-table-summary.csv",
        "blocks.csv",
    ]
    rows = list(csv.DictReader(io.StringIO(bundle.read("block-2-table-summary.csv").decode())))
    frozen = {(r["preset"], r["staleness"]): r["value"] for r in version.blocks[1]["data"]["summary"]}
    assert {(r["preset"], r["staleness"]): float(r["value"]) for r in rows} == frozen
    blocks = list(csv.DictReader(io.StringIO(bundle.read("blocks.csv").decode())))
    assert [b["kind"] for b in blocks] == ["chart", "table"] and len(blocks[0]["runs"].split()) == 36


def test_the_html_export_carries_plotly_and_the_data_inline(alice_client, alice, demo):
    report = Report.objects.create(team=demo.team, author=alice, title="t", source=source(demo))
    service.publish(report, alice)
    response = alice_client.get(f"/reports/{report.pk}/export.html")
    html = response.content.decode()
    assert 'attachment; filename="report-' in response["Content-Disposition"]
    assert "<script src=" not in html and "<link" not in html, "nothing to fetch"
    assert "Plotly" in html and 'id="report-charts"' in html
    assert (
        alice_client.get(
            f"/reports/{Report.objects.create(team=demo.team, author=alice, title='d').pk}/export.html"
        ).status_code
        == 409
    )


def test_runs_a_published_report_cites_can_be_archived_but_not_deleted(api, alice_client, alice, demo):
    report = Report.objects.create(team=demo.team, author=alice, title="Kept", source=source(demo))
    service.publish(report, alice)
    refused = api.call("delete", f"/experiments/{demo.pk}")
    assert refused.status_code == 409
    assert (
        f"report “Kept” (#{report.pk})" in refused.json()["detail"] and "archive" in refused.json()["detail"]
    )
    page = alice_client.post(f"/experiments/{demo.pk}/delete/", follow=True).content.decode()
    assert "Not deleted" in page and "Kept" in page
    assert Run.objects.filter(experiment=demo).count() == 36
    run = demo.runs.first()
    assert alice_client.post(f"/runs/{run.pk}/archive/").status_code == 302
    run.refresh_from_db()
    assert run.archived is not None
    assert api.call("delete", f"/reports/{report.pk}").json() == {"report": report.pk}
    assert api.call("delete", f"/experiments/{demo.pk}").status_code == 200, "no report holds them now"


def test_another_teams_reports_do_not_exist(client, alice, demo):
    report = Report.objects.create(team=demo.team, author=alice, title="Secret", source=source(demo))
    service.publish(report, alice)
    bob = new_team_member("bob", "team-b")
    client.force_login(bob)
    for path in ("", "edit", "current", "export.html", "export-csv.zip"):
        assert client.get(f"/reports/{report.pk}/{path}").status_code == 404, path
    assert client.post(f"/reports/{report.pk}/delete").status_code == 404
    assert client.post(f"/reports/{report.pk}/edit", {"title": "x", "source": ""}).status_code == 404
    assert "Secret" not in client.get("/reports/").content.decode()

    from django.core.management import call_command

    out = io.StringIO()
    call_command("create_token", "bob", stdout=out)
    headers = {"HTTP_AUTHORIZATION": f"Bearer {out.getvalue().strip()}"}
    for method, path in (
        ("get", ""),
        ("get", "/current"),
        ("post", "/publish"),
        ("put", ""),
        ("delete", ""),
    ):
        body = {} if method == "get" else {"data": "{}", "content_type": "application/json"}
        response = getattr(client, method)(f"/api/reports/{report.pk}{path}", **body, **headers)
        assert response.status_code == 404, (method, path)
    assert client.get("/api/reports", **headers).json() == {"reports": []}
    # Nor can bob's report cite alice's runs or claims.
    response = client.post(
        "/api/reports",
        json.dumps({"title": "t", "source": source(demo), "publish": True}),
        content_type="application/json",
        **headers,
    )
    assert response.status_code == 422 and "in team team-b" in response.json()["detail"][0]["msg"]
    assert Report.objects.get(pk=report.pk).title == "Secret"


def test_a_new_report_needs_a_title_and_one_of_your_teams(alice_client, alice, demo):
    other = new_team_member("bob", "team-b").memberships.get().team
    for team in ("abc", str(other.pk), "9" * 30):
        response = alice_client.post("/reports/", {"title": "t", "team": team})
        assert response.status_code == 200 and "team: choose one of your teams" in response.content.decode()
    assert alice_client.post("/reports/", {"title": "", "team": demo.team.pk}).status_code == 200
    assert not Report.objects.exists()
    made = alice_client.post("/reports/", {"title": "Mine"})
    report = Report.objects.get()
    assert made.url == f"/reports/{report.pk}/edit" and report.team == demo.team


def test_only_its_author_or_a_team_admin_changes_a_report(client, alice, demo):
    report = Report.objects.create(team=demo.team, author=alice, title="Mine", source="")
    from accounts.models import Membership

    carol = new_team_member("carol", "team-c")
    Membership.objects.create(team=demo.team, user=carol, is_admin=False)
    client.force_login(carol)
    assert client.get(f"/reports/{report.pk}/").status_code == 200, "the team sees it"
    assert client.get(f"/reports/{report.pk}/edit").status_code == 403
    assert client.post(f"/reports/{report.pk}/delete").status_code == 403
