"""The comparison dashboard's pages and data: of an experiment, or of runs picked on the runs page
(`?runs=…`), as a page, JSON or CSV; and a run's own curves. Every query goes through
`visible_to(user)`, so another team's runs are 404s (or, in a permalink, left out, saying so)."""

from __future__ import annotations

import re

import numpy as np
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse

from dashboards.comparison import compare, curves, export, payloads, points, query, statistics
from experiments import collapse, packing, series
from experiments.models import Experiment, Run


def _experiment(request: HttpRequest, experiment_id: int) -> Experiment:
    return get_object_or_404(Experiment.visible_to(request.user).select_related("team"), pk=experiment_id)


def _compare_page(request: HttpRequest, context: dict) -> HttpResponse:
    """The dashboard page; its script draws everything from the data URLs in `context`."""
    return render(
        request,
        "dashboards/compare.html",
        {
            **context,
            "metrics": compare.METRICS,
            "x_axes": curves.X_AXES,
            "bands": curves.BANDS,
            "rules": curves.RULES,
            "min_ci_seeds": curves.MIN_CI_SEEDS,
            "few_seeds": statistics.FEW_SEEDS,
            "contended_cores": settings.LAB_CONTENDED_CORES,
            "collapse_rule": {
                "fraction": collapse.NEAR_ZERO_FRACTION,
                "min_best": collapse.MIN_BEST,
                "min_evals": collapse.MIN_EVALS,
            },
        },
    )


def _imported(runs) -> list[Run]:
    """The runs among `runs` imported from other tools' files (the page marks them), not archived."""
    return list(runs.filter(imported__isnull=False, archived=None).select_related("imported").order_by("pk"))


def _bad_query(exc: query.QueryError) -> JsonResponse:
    return JsonResponse({"detail": [{"param": exc.param, "msg": exc.message}]}, status=400)


def _comparison(request: HttpRequest, runs, table: str, name: str) -> HttpResponse:
    """`compare` of `runs` for the query string (`table` "summary": `compare.summary_table`, no
    curves): JSON, or with `format=csv` the curves or summary table as a CSV file whose name
    starts with `name`."""
    try:
        asked = query.ComparisonQuery.parse(request.GET)
        output = request.GET.get("format", "json")
        if output not in ("json", "csv"):
            raise query.QueryError("format", f"format must be json or csv (got {output!r})")
    except query.QueryError as exc:
        return _bad_query(exc)
    if output == "json":

        def body() -> bytes:
            if table == "summary":
                payload = compare.summary_table(runs, asked)
                return payloads.json_bytes(
                    {"summary": payload["summary"], "throughput": payload["throughput"]}
                )
            return payloads.json_bytes(compare.compare(runs, asked))

        content = payloads.cached((table, asked, payloads.state(runs)), body)
        return HttpResponse(content, content_type="application/json")
    if table == "curves":
        text = export.curves_csv(compare.compare(runs, asked))
    else:
        text = export.summary_csv(compare.summary_table(runs, asked))
    response = HttpResponse(text, content_type="text/csv")
    metric = re.sub(r"[^A-Za-z0-9_.-]+", "-", asked.metric).strip("-")
    response["Content-Disposition"] = (
        f'attachment; filename="{name}-{metric}-{asked.x if table == "curves" else asked.rule}-{table}.csv"'
    )
    return response


@login_required
def experiment_compare(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = _experiment(request, experiment_id)
    return _compare_page(
        request,
        {
            "experiment": experiment,
            "imported_runs": _imported(experiment.runs.all()),
            "data_url": reverse("experiment-compare-data", args=[experiment.pk]),
            "summary_url": reverse("experiment-compare-summary", args=[experiment.pk]),
        },
    )


@login_required
def experiment_compare_data(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """Aggregated curves, summary and per-run final values as JSON; `format=csv` gives the curves."""
    experiment = _experiment(request, experiment_id)
    return _comparison(request, experiment.runs.all(), "curves", f"experiment-{experiment.pk}")


@login_required
def experiment_compare_summary(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """The summary table (final value ± CI and throughput per preset × staleness) as JSON or, with
    `format=csv`, CSV."""
    experiment = _experiment(request, experiment_id)
    return _comparison(request, experiment.runs.all(), "summary", f"experiment-{experiment.pk}")


def _selected_runs(request: HttpRequest):
    """The runs picked in `?runs=…`, all of them in the user's teams (else a QueryError)."""
    return query.selected_runs(Run.visible_to(request.user), query.parse_run_ids(request.GET))


@login_required
def runs_compare(request: HttpRequest) -> HttpResponse:
    """Any runs of the user's teams, picked on the runs page, on one dashboard. A link naming runs
    the user cannot see (a permalink from another team's member) shows the ones they can, saying
    how many were left out, and never which of those exist."""
    try:
        wanted = query.parse_run_ids(request.GET)
    except query.QueryError as exc:
        messages.error(request, exc.message)
        return redirect("run-list")
    runs = Run.visible_to(request.user).filter(pk__in=wanted)
    shown = list(runs.order_by("pk").values_list("pk", flat=True))
    if not shown:
        messages.error(request, "None of the linked runs is in your teams (or they no longer exist).")
        return redirect("run-list")
    left_out = len(wanted) - len(shown)
    if left_out:
        messages.warning(
            request,
            f"{left_out} of the {len(wanted)} linked runs {'is' if left_out == 1 else 'are'} not in your teams "
            "or no longer exist, and left out: the dashboard shows the others.",
        )
    ids = ",".join(map(str, shown))
    return _compare_page(
        request,
        {
            "selected": ids,
            "n_selected": len(shown),
            "imported_runs": _imported(runs),
            "experiments": Experiment.objects.filter(runs__in=runs).distinct().order_by("pk"),
            "data_url": reverse("runs-compare-data"),
            "summary_url": reverse("runs-compare-summary"),
        },
    )


def _selection_comparison(request: HttpRequest, table: str) -> HttpResponse:
    try:
        runs = _selected_runs(request)
    except query.QueryError as exc:
        return _bad_query(exc)
    return _comparison(request, runs, table, "runs")


@login_required
def runs_compare_data(request: HttpRequest) -> HttpResponse:
    """`experiment_compare_data` for the runs in `?runs=…`."""
    return _selection_comparison(request, "curves")


@login_required
def runs_compare_summary(request: HttpRequest) -> HttpResponse:
    """`experiment_compare_summary` for the runs in `?runs=…`."""
    return _selection_comparison(request, "summary")


@login_required
def run_curves(request: HttpRequest, run_id: int) -> JsonResponse:
    """Every metric the run logged as `{name: {"x": steps, "y": values}}`, each downsampled to at most
    `curves.MAX_BUCKETS` buckets (min, max and last of each, so spikes survive); missing values are null,
    and in an imported run so is each step of a metric's cadence its tool dropped (`curves.dropped_as_gaps`).
    A damaged chunk (`series.Damage`) is a null at its first step, so the line breaks there, and a
    note in `damaged` ({name: [notes]})."""
    run = get_object_or_404(Run.visible_to(request.user), pk=run_id)
    metrics, damaged = {}, []
    for name, (steps, values, _) in series.points_of(run.pk, damaged=damaged):
        if run.is_imported:  # a value the tool dropped is a break in the line, as in the table
            steps, values = curves.dropped_as_gaps(steps, values)
        y = np.where(np.isfinite(values), values, np.nan)  # a value not finite is null in the JSON
        keep = curves.downsample_index(y)
        x, y = steps[keep].astype(float), y[keep]
        gaps = [d.chunk << packing.CHUNK_BITS for d in damaged if d.name == name]
        if gaps:
            at = np.searchsorted(x, gaps)
            x, y = np.insert(x, at, gaps), np.insert(y, at, np.nan)
        metrics[name] = {"x": points.json_numbers(x), "y": points.json_numbers(y)}
    return JsonResponse(
        {
            "run": run.pk,
            "active": run.is_active,
            "metrics": metrics,
            "damaged": series.notes_by_metric(damaged),
        }
    )
