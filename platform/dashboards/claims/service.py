"""Claims a team states (`dashboards.models.Claim`), read against their runs: the final values per
cell for a claim's metric and rule, a new claim checked against its runs (`ClaimIn`'s rules, every
error naming its field), templates made claims, and each claim's verdict
(`dashboards.claims.verdicts.evaluate`)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.shortcuts import get_object_or_404
from pydantic import ValidationError

from dashboards.claims import templates, verdicts
from dashboards.claims.schemas import Against, ClaimIn
from dashboards.comparison import curves, grouping, query, reads
from dashboards.models import Claim
from dashboards.signals import claim_stated
from experiments.models import Experiment, Run
from lab.errors import FieldError

MAX_LISTED = 200
STATED = set(ClaimIn.model_fields) - {"experiment", "runs", "template", "variant"}
"""A claim's own fields, as `Claim` stores them: all of `ClaimIn` but what it is stated on."""


class ClaimError(FieldError):
    """A claim's field that breaks a rule."""


def line_names(runs: list[Run]) -> dict[int, str]:
    """Each run's line as the comparison names it: its preset and variant, and its experiment when
    the runs come from several."""
    several = len({run.experiment_id for run in runs}) > 1
    return {run.pk: grouping.line_label(run.line, run.experiment, several) for run in runs}


def cell_data(runs: list[Run], metric: str, rule: str, k: int, delta: float) -> verdicts.Data:
    """The runs' final values of `metric` by `rule` (on the step axis, as the comparison takes them:
    `reads.final_values`) per (line, staleness) cell, with each cell's runs
    (queued or running, all but those that ended early: `Run.ended_early`, no finished seed) and its
    on-policy label."""
    names = line_names(runs)
    stored = reads.final_values(runs, query.ComparisonQuery(metric=metric, rule=rule, k=k))
    finals: dict[verdicts.Cell, dict[int, float]] = defaultdict(dict)
    counts: dict[verdicts.Cell, list[int]] = defaultdict(lambda: [0, 0])
    for run in runs:
        cell = (names[run.pk], run.staleness)
        counts[cell][0] += run.is_active
        counts[cell][1] += not run.ended_early
        value = stored.get(run.pk, math.nan)
        if math.isfinite(value):
            finals[cell][run.seed] = value
    on_policy = templates.baseline({run.staleness for run in runs}) or templates.ON_POLICY
    return verdicts.Data(
        dict(finals), {c: (a, n) for c, (a, n) in counts.items()}, on_policy, curves.decision_digits(delta)
    )


def validate(runs: list[Run], payload: dict[str, Any]) -> dict[str, Any]:
    """The claim's fields from `payload` (a `ClaimIn`'s), checked against the lines and settings of
    `runs`; a ClaimError naming the first field that breaks a rule."""
    labels = list(dict.fromkeys(run.staleness for run in runs))
    against = Against(list(dict.fromkeys(line_names(runs).values())), labels, templates.baseline(labels))
    try:
        claim = ClaimIn.model_validate(payload, context={"against": against})
    except ValidationError as exc:
        raise ClaimError.first_of(exc) from exc
    return claim.model_dump(include=STATED)


def statement(claim: Claim) -> verdicts.Statement:
    return verdicts.Statement(
        tuple(verdicts.Part(p["kind"], p["x"], p.get("y", "")) for p in claim.parts),
        tuple(claim.settings),
        claim.quantifier,
        claim.delta,
        claim.alpha,
    )


def _cell_runs(runs: Iterable[Run], cells: set[verdicts.Cell]) -> list[Run]:
    runs = list(runs)
    names = line_names(runs)
    return [run for run in runs if (names[run.pk], run.staleness) in cells]


def state(user, team, experiment, run_ids: list[int], fields: dict[str, Any], template: str = "") -> Claim:
    """Store a validated claim, pre-registered if no run of its cells has finished yet."""
    with transaction.atomic():
        claim = Claim(
            team=team, experiment=experiment, run_ids=run_ids, author=user, template=template, **fields
        )
        runs = list(claim.runs().select_related("experiment"))
        on_policy = templates.baseline({run.staleness for run in runs}) or templates.ON_POLICY
        cells = set(verdicts.cells(statement(claim), on_policy))
        # A run that ended (whatever its status) or has a finish time counts as finished: the safe side.
        claim.pre_registered = not any(
            run.finished is not None or not run.is_active for run in _cell_runs(runs, cells)
        )
        claim.save()
    return claim


def from_template(runs: list[Run], name: str, variant: str, delta: float) -> dict[str, Any]:
    """A paper template's claim fields for these runs (one variant's lines), as `validate` takes them."""
    template = next((t for t in templates.PAPER_TEMPLATES if t["name"] == name), None)
    if template is None:
        names = ", ".join(t["name"] for t in templates.PAPER_TEMPLATES)
        raise ClaimError("template", f"template must be one of {names} (got {name!r})")
    picked = [run for run in runs if run.variant_label == variant]
    if not picked:
        raise ClaimError("variant", f"no runs with the variant {variant!r}")
    names = line_names(picked)
    by_preset = {run.preset: names[run.pk] for run in picked}
    data = cell_data(picked, "eval/accuracy", "last", 10, delta)
    preset_data = verdicts.Data(
        {(p, s): v for p in by_preset for (line, s), v in data.finals.items() if line == by_preset[p]},
        {(p, s): v for p in by_preset for (line, s), v in data.runs.items() if line == by_preset[p]},
        data.on_policy,
        data.digits,
    )
    tested = list(dict.fromkeys(run.staleness for run in picked))
    lags = {label: lag["mean_lag"] for label, lag in grouping.mean_lags(picked).items()}
    made, lacking = templates.instantiate(template, preset_data, tested, lags, delta)
    if lacking:
        raise ClaimError("template", f"these runs cannot state it: they need {'; '.join(lacking)}")
    missing = [p for part in made.parts for p in (part.x, part.y) if p and p not in by_preset]
    if missing:
        raise ClaimError("template", f"these runs have no {', '.join(dict.fromkeys(missing))} runs")
    return {
        "title": template["title"],
        "parts": [
            {"kind": p.kind, "x": by_preset[p.x], "y": by_preset[p.y] if p.y else ""} for p in made.parts
        ],
        "settings": list(made.settings),
        "quantifier": made.quantifier,
        "delta": made.delta,
    }


def target(user, experiment_id: int | None, run_ids: list[int] | None):
    """(team, experiment or None, run ids, runs) a claim is stated on: an experiment the user can
    see (else 404) or a selection of runs of one of their teams (else a ClaimError); `ClaimIn`
    makes sure it is one of them."""
    if experiment_id is not None:
        experiment = get_object_or_404(Experiment.visible_to(user), pk=experiment_id)
        runs = list(experiment.runs.filter(archived=None).select_related("experiment"))
        if not runs:
            raise ClaimError("experiment", f"experiment {experiment.pk} has no runs that are not archived")
        return experiment.team, experiment, [], runs
    ids = list(dict.fromkeys(run_ids))
    try:
        if not 1 <= len(ids) <= query.MAX_SELECTED_RUNS:
            raise query.QueryError(
                "runs", f"runs must name 1 to {query.MAX_SELECTED_RUNS} runs (got {len(ids)})"
            )
        runs = list(
            query.selected_runs(Run.visible_to(user), ids).filter(archived=None).select_related("experiment")
        )
    except query.QueryError as exc:
        raise ClaimError("runs", exc.message) from exc
    if not runs:
        raise ClaimError("runs", "these runs are all archived: unarchive them, or name others")
    if len({run.experiment.team_id for run in runs}) > 1:
        raise ClaimError("runs", "a claim's runs must all belong to one team")
    return runs[0].experiment.team, None, sorted(ids), runs


def submit(user, body: ClaimIn) -> dict[str, Any]:
    """State the claim `body` describes and return it with its verdict now; a ClaimError naming
    the field, or a 404 for an experiment the user cannot see."""
    team, experiment, ids, runs = target(user, body.experiment, body.runs)
    payload = body.model_dump(exclude_none=True)
    if body.template:
        payload |= from_template(runs, body.template, body.variant, body.delta)
    claim = state(user, team, experiment, ids, validate(runs, payload), body.template)
    outcome = result(claim, runs)
    claim_stated.send_robust(Claim, claim=claim, verdict=outcome["verdict"])
    return as_dict(claim, outcome)


def result(claim: Claim, runs: list[Run] | None = None) -> dict[str, Any]:
    """The claim's verdict now, with every test, `provisional` while its cells still run, and
    `runs_ended_early`: runs of its cells left out as ended before their last step."""
    runs = list(claim.runs().select_related("experiment")) if runs is None else runs
    data = cell_data(runs, claim.metric, claim.rule, claim.k, claim.delta)
    made = statement(claim)
    out = verdicts.evaluate(made, data)
    cells = verdicts.cells(made, data.on_policy)
    active = sum(data.runs.get(cell, (0, 0))[0] for cell in cells)
    total = sum(data.runs.get(cell, (0, 0))[1] for cell in cells)
    out.update(
        provisional=active > 0,
        runs_active=active,
        runs=total,
        runs_ended_early=sum(run.ended_early for run in _cell_runs(runs, set(cells))),
        on_policy=data.on_policy,
        digits=data.digits,
    )
    return out


def may_withdraw(user, claim: Claim) -> bool:
    return claim.author_id == user.pk or claim.team.is_admin(user)


def as_dict(claim: Claim, outcome: dict[str, Any]) -> dict[str, Any]:
    """A claim and its verdict as the API and the pages give them."""
    outcome = dict(outcome)
    outcome["runs_total"] = outcome.pop("runs")
    return {
        "id": claim.pk,
        "experiment": claim.experiment_id,
        "runs": claim.run_ids,
        "title": claim.title,
        "template": claim.template,
        "parts": claim.parts,
        "settings": claim.settings,
        "quantifier": claim.quantifier,
        "metric": claim.metric,
        "rule": claim.rule,
        "k": claim.k,
        "delta": claim.delta,
        "alpha": claim.alpha,
        "author": claim.author.get_username(),
        "stated": claim.stated.isoformat(),
        "pre_registered": claim.pre_registered,
        **outcome,
    }
