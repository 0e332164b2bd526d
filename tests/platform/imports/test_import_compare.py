"""Imported runs in the comparison, the claims and the reports, alike with the lab's own: an
experiment of native grpo runs and imported reinforce runs (prime-rl files) compares, claims and
reports exactly as the same experiment with the same points logged by native reinforce runs; the
paired t test pairs an imported seed with a native one. A report citing an imported run freezes,
and exports as HTML and CSV; the comparison page and the run list mark the imported runs."""

from __future__ import annotations

import csv
import io
import zipfile

import pytest
from django.urls import reverse
from import_helpers import Api, import_command, prime_rl_file
from sample_experiments import make_finished_experiment
from support import log_points

from dashboards.models import Report
from dashboards.reports import service as reports
from experiments import packing, series
from experiments.models import Run
from imports.models import Import
from rlcore.config import RunConfig

pytestmark = pytest.mark.django_db

SEEDS = (0, 1, 2)
GRPO = {0: 0.50, 1: 0.55, 2: 0.60}
REINFORCE = {0: 0.58, 1: 0.62, 2: 0.69}  # beats grpo by 0.08, 0.07, 0.09 seed for seed
CLAIM = {
    "parts": [{"kind": "beats", "x": "reinforce", "y": "grpo"}],
    "settings": ["on-policy"],
    "delta": 0.02,
}


def grpo_experiment(team, alice, name):
    return make_finished_experiment(
        team,
        alice,
        name=name,
        presets=("grpo",),
        staleness=({},),
        seeds=SEEDS,
        final_accuracy=lambda preset, staleness, seed: GRPO[seed],
    )


@pytest.fixture
def mixed(team, alice, tmp_path):
    """Native grpo runs and imported reinforce runs, seeds 0, 1, 2."""
    experiment = grpo_experiment(team, alice, "mixed")
    for seed in SEEDS:
        path = prime_rl_file(tmp_path / f"reinforce-{seed}.jsonl", seed=seed, final=REINFORCE[seed])
        import_command(
            path,
            experiment,
            preset="reinforce",
            staleness="on-policy",
            seed=seed,
            map=["eval/acc=eval/accuracy"],
        )
    return experiment


@pytest.fixture
def native(team, alice, mixed):
    """The same experiment with every imported run's points logged by a native run instead."""
    experiment = grpo_experiment(team, alice, "native")
    for record in Import.objects.filter(experiment=mixed).select_related("run").order_by("run__seed"):
        imported = record.run
        run = Run.create_for(
            experiment,
            RunConfig.model_validate(imported.config),
            status=Run.SUCCEEDED,
            progress=imported.progress,
        )
        log_points(
            run,
            [
                (name, step, value, packing.wall_time(us))
                for name, (steps, values, times) in series.points_of(imported.pk)
                for step, value, us in zip(steps.tolist(), values.tolist(), times.tolist(), strict=True)
            ],
        )
        run.summary = run.summary_from_points()
        run.save(update_fields=["summary"])
    return experiment


@pytest.fixture
def api(client, token):
    return Api(client, token)


def data(client, experiment, **params):
    """The experiment's comparison payload."""
    response = client.get(reverse("experiment-compare-data", args=[experiment.pk]), params)
    assert response.status_code == 200, response.content
    return response.json()


def without_ids(value):
    """A payload with what names runs and experiments (ids, names) left out, to compare two."""
    if isinstance(value, dict):
        return {
            k: without_ids(v)
            for k, v in value.items()
            if k not in ("id", "run", "runs", "run_ids", "experiment")
        }
    if isinstance(value, list):
        return [without_ids(v) for v in value]
    return value


def test_a_claim_pairs_imported_and_native_seeds_as_it_pairs_native_ones(api, mixed, native):
    stated = {
        name: api.call("post", "/claims", {"experiment": e.pk, **CLAIM})
        for name, e in (("mixed", mixed), ("native", native))
    }
    assert {name: answer.status_code for name, answer in stated.items()} == {"mixed": 201, "native": 201}
    mixed_claim, native_claim = stated["mixed"].json(), stated["native"].json()
    assert mixed_claim["verdict"] == "support" and mixed_claim["runs_total"] == 6
    (row,) = mixed_claim["by_setting"][0]["parts"]
    assert row["paired"] and row["n"] == 3 and row["test"] == "paired t", row
    assert row["estimate"] == pytest.approx(0.08, abs=1e-3)
    assert without_ids(mixed_claim["by_setting"]) == without_ids(native_claim["by_setting"])


def test_the_comparison_reads_imported_runs_as_native_ones(alice_client, mixed, native):
    found = data(alice_client, mixed, metric="eval/accuracy")
    same = data(alice_client, native, metric="eval/accuracy")
    rows = {(r["preset"], r["staleness"]): r for r in found["summary"]}
    assert rows[("reinforce", "on-policy")]["n_seeds"] == 3
    assert rows[("reinforce", "on-policy")]["value"] == pytest.approx(sum(REINFORCE.values()) / 3)
    assert without_ids(found["summary"]) == without_ids(same["summary"])
    assert without_ids(found["statistics"]) == without_ids(same["statistics"])


def test_the_pages_mark_imported_runs(alice_client, mixed):
    imported = sorted(Import.objects.filter(experiment=mixed).values_list("run_id", flat=True))
    for url in (
        f"/experiments/{mixed.pk}/",
        f"/experiments/{mixed.pk}/compare/",
        f"/compare/?runs={','.join(map(str, imported))}",
        "/runs/",
        f"/runs/{imported[0]}/",
    ):
        page = alice_client.get(url)
        assert page.status_code == 200, url
        assert 'class="badge imported"' in page.content.decode(), url
    run_page = alice_client.get(f"/runs/{imported[0]}/").content.decode()
    assert "reinforce-0.jsonl" in run_page and "prime-rl" in run_page
    assert f'action="/runs/{imported[0]}/retry/"' not in run_page
    assert f'action="/runs/{imported[0]}/cancel/"' not in run_page
    retried = alice_client.post(f"/runs/{imported[0]}/retry/", follow=True).content.decode()
    assert "is read-only: it cannot be retried" in retried


def test_a_report_citing_imported_runs_freezes_and_exports(alice_client, alice, mixed, api, tmp_path):
    claim = api.call("post", "/claims", {"experiment": mixed.pk, **CLAIM}).json()
    source = "\n\n".join(
        [
            "# Imported reinforce against our grpo",
            f"{{{{ chart /experiments/{mixed.pk}/compare/?metric=eval/accuracy }}}}",
            f"{{{{ table /experiments/{mixed.pk}/compare/?metric=eval/accuracy&rule=last }}}}",
            f"{{{{ claim /claims/{claim['id']}/ }}}}",
        ]
    )
    report = Report.objects.create(team=mixed.team, author=alice, title="Imported", source=source)
    version = reports.publish(report, alice)
    imported = set(Import.objects.filter(experiment=mixed).values_list("run_id", flat=True))
    chart, table, claimed = version.blocks
    assert imported <= set(chart["run_ids"]) and imported <= set(table["run_ids"])
    (row,) = [r for r in table["data"]["summary"] if r["preset"] == "reinforce"]
    assert row["n_seeds"] == 3 and claimed["claim"]["verdict"] == "support"

    # Re-importing a cited file changes nothing: the version and what it reads now agree.
    again = import_command(
        tmp_path / "reinforce-0.jsonl", mixed, preset="grpo", staleness="on-policy", seed=0
    )
    assert "nothing changed" in again
    now = api.call("get", f"/reports/{report.pk}/current").json()["blocks"]
    assert not any(block["changed"] for block in now)

    bundle = zipfile.ZipFile(io.BytesIO(alice_client.get(f"/reports/{report.pk}/export-csv.zip").content))
    summary = list(csv.DictReader(io.StringIO(bundle.read("block-2-table-summary.csv").decode())))
    assert {(r["preset"], float(r["value"])) for r in summary} == {
        (r["preset"], r["value"]) for r in table["data"]["summary"]
    }
    runs = list(csv.DictReader(io.StringIO(bundle.read("block-2-table-runs.csv").decode())))
    assert imported <= {int(r["id"]) for r in runs}
    html = alice_client.get(f"/reports/{report.pk}/export.html")
    assert html.status_code == 200 and "Plotly" in html.content.decode()
    # A cited imported run is kept, as any cited run is.
    assert api.call("delete", f"/experiments/{mixed.pk}").status_code == 409
