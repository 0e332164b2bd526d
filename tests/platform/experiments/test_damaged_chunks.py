"""A damaged metric chunk (its bytes changed at rest, as `UPDATE experiments_metricchunk` does: a column
that is not zlib, one flipped byte, a raw chunk cut short) is never read as points and never a 500:
the run's page, curves, CSV and API leave its points out (a gap) and name the metric in a note; a
comparison (and a report citing it) leaves that run out of the metric, says so, and shows every
other run exactly as before."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from django.db import connection
from django.urls import reverse
from sample_experiments import make_finished_experiment

from dashboards.comparison import payloads
from experiments import packing, series
from experiments.models import MetricChunk

pytestmark = pytest.mark.django_db

METRIC = "eval/accuracy"  # logged every 5 steps: its steps pack as a zlib stream, not as a range
STEPS = 1100  # chunk 0 (steps 0–1023) packed, chunk 1 (1024–1100) raw: the series' newest


def _set(run, chunk: int, column: str, data: bytes) -> None:
    """Overwrite one column of one stored chunk of `METRIC` in place, as a person at psql would."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE experiments_metricchunk SET {column} = %s WHERE run_id = %s AND name = %s AND chunk = %s",
            [data, run.pk, METRIC, chunk],
        )


def _stored(run, chunk: int, column: str) -> bytes:
    return bytes(MetricChunk.objects.values_list(column, flat=True).get(run=run, name=METRIC, chunk=chunk))


def _flip(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :]


# Each kind of damage: (its chunk, what it does to it).
DAMAGE = {
    "values not zlib": (0, lambda run: _set(run, 0, "value_data", b"\xde\xad\xbe\xef")),
    "steps not zlib": (0, lambda run: _set(run, 0, "step_data", b"\xde\xad\xbe\xef")),
    "one flipped byte": (0, lambda run: _set(run, 0, "value_data", _flip(_stored(run, 0, "value_data")))),
    "raw values a point short": (
        1,
        lambda run: _set(run, 1, "value_data", _stored(run, 1, "value_data")[:-8]),
    ),
    "raw values cut mid-value": (
        1,
        lambda run: _set(run, 1, "value_data", _stored(run, 1, "value_data")[:-3]),
    ),
    "raw columns all a point short": (
        1,
        lambda run: [
            _set(run, 1, column, _stored(run, 1, column)[:-size])
            for column, size in (("step_data", 2), ("value_data", 8), ("time_data", 8))
        ],
    ),
}


@pytest.fixture
def two_runs(team, alice):
    """Two finished runs of one experiment in cells of their own (reinforce, grpo), each with
    every metric over steps 0–1100."""
    experiment = make_finished_experiment(
        team, alice, presets=("reinforce", "grpo"), staleness=({},), seeds=(0,), steps=STEPS
    )
    return experiment, experiment.runs.get(preset="reinforce"), experiment.runs.get(preset="grpo")


def _get(client, url: str, **headers):
    response = client.get(url, **headers)
    assert response.status_code == 200, (url, response.status_code, response.content[:2000])
    return response


def _comparisons(experiment, damaged, intact) -> dict[str, str]:
    """Every comparison that includes the damaged run: page data and API, by experiment and by runs."""
    ids = f"{damaged.pk},{intact.pk}"
    return {
        "experiment data": f"/experiments/{experiment.pk}/compare/data?metric={METRIC}",
        "experiment data, x = time": f"/experiments/{experiment.pk}/compare/data?metric={METRIC}&x=time",
        "runs data": f"/compare/data?runs={ids}&metric={METRIC}",
        "experiment API": f"/api/experiments/{experiment.pk}/compare?metric={METRIC}",
        "runs API": f"/api/compare?runs={ids}&metric={METRIC}",
    }


def _of_run(payload: dict, run) -> dict:
    """What a comparison shows of one run: its row and its cell's curve."""
    (row,) = [r for r in payload["runs"] if r["id"] == run.pk]
    (group,) = [g for g in payload["groups"] if g["preset"] == run.preset]
    return {"row": row, "group": group}


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_chunk_is_a_gap_with_a_note_on_every_page_and_endpoint(alice_client, token, two_runs, kind):
    experiment, damaged, intact = two_runs
    api = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    comparisons = _comparisons(experiment, damaged, intact)
    before = {what: _get(alice_client, url, **api).json() for what, url in comparisons.items()}
    curves_before = _get(alice_client, reverse("run-curves", args=[damaged.pk])).json()
    source = (
        f"{{{{ chart /compare/?runs={damaged.pk},{intact.pk}&metric={METRIC} }}}}\n\n"
        f"{{{{ table /experiments/{experiment.pk}/compare/?metric={METRIC}&rule=last }}}}"
    )
    made = alice_client.post(
        "/api/reports",
        json.dumps({"title": "Cites a run", "source": source, "publish": True}),
        content_type="application/json",
        **api,
    )
    assert made.status_code == 201, made.content
    report = made.json()["id"]

    chunk, damage = DAMAGE[kind]
    damage(damaged)
    payloads.forget()  # what was computed from the intact chunk is kept while the runs' state stands
    first = chunk << packing.CHUNK_BITS
    with pytest.raises(packing.Damaged):
        series.series(damaged.pk, METRIC)  # a reader that does not collect damage refuses it, loudly
    note = f"{METRIC}: the points stored for steps {first}–{first + packing.CHUNK_STEPS - 1} are damaged"
    gap = set(range(first, first + packing.CHUNK_STEPS))

    # The run's page, curves and CSV.
    page = _get(alice_client, reverse("run-detail", args=[damaged.pk])).content.decode()
    if chunk == 1:  # the recent-metrics table reads the newest chunk: it names the metric there
        assert 'id="damaged-metrics"' in page and note in page
    shown = _get(alice_client, reverse("run-curves", args=[damaged.pk])).json()
    (said,) = shown["damaged"][METRIC]
    assert said.startswith(note), said
    y = dict(zip(shown["metrics"][METRIC]["x"], shown["metrics"][METRIC]["y"], strict=True))
    assert y[first] is None, "the line breaks at the gap"
    assert all(step not in gap or step == first for step in y), "no point of the damaged chunk is drawn"
    assert set(shown["damaged"]) == {METRIC}
    for name, curve in curves_before["metrics"].items():
        if name != METRIC:
            assert shown["metrics"][name] == curve, name
    rows = list(
        csv.DictReader(
            io.StringIO(_get(alice_client, reverse("run-metrics-csv", args=[damaged.pk])).content.decode())
        )
    )
    noted = [r for r in rows if r["note"]]
    assert [(r["name"], r["step"], r["value"]) for r in noted] == [(METRIC, "", "")] and noted[0][
        "note"
    ].startswith(note)
    kept = [int(r["step"]) for r in rows if r["name"] == METRIC and r["step"]]
    assert kept and not gap & set(kept)
    assert len([r for r in rows if r["name"] == "reward/mean"]) == STEPS + 1

    # The API.
    metrics = _get(alice_client, f"/api/runs/{damaged.pk}/metrics", **api).json()
    assert [n[: len(note)] for n in metrics["damaged"][METRIC]] == [note]
    assert not gap & {step for step, _ in metrics["metrics"][METRIC]}
    assert len(metrics["metrics"]["reward/mean"]) == STEPS + 1
    one = _get(alice_client, f"/api/runs/{damaged.pk}/metrics?name={METRIC}", **api).json()
    assert set(one["metrics"]) == {METRIC} and one["damaged"] == metrics["damaged"]
    text = _get(alice_client, f"/api/runs/{damaged.pk}/metrics?format=csv", **api).content.decode()
    assert note in text

    # Every comparison that includes it: the run left out of the metric, said so; the other run as before.
    for what, url in comparisons.items():
        payload = _get(alice_client, url, **api).json()
        (warning,) = payload["damaged"]
        assert (warning["run"], warning["metric"]) == (damaged.pk, METRIC), what
        assert warning["note"].startswith(f"Run {damaged.pk} is left out") and note in warning["note"], what
        assert _of_run(payload, intact) == _of_run(before[what], intact), what
        left_out = _of_run(payload, damaged)
        assert left_out["row"]["final"] is None and left_out["group"]["n_seeds"] == 0, what
        assert _of_run(before[what], damaged)["group"]["n_seeds"] == 1, what

    # The report citing it: its page, its draft's editor, compared with the data now, published again.
    current = _get(alice_client, f"/api/reports/{report}/current", **api).json()
    assert [len(block["damaged"]) for block in current["blocks"]] == [1, 1]
    assert note in _get(alice_client, reverse("report-current", args=[report])).content.decode()
    assert _get(alice_client, reverse("report-detail", args=[report])).status_code == 200
    editor = _get(alice_client, reverse("report-edit", args=[report])).content.decode()
    assert editor.count('class="report-damaged errorlist"') == 2 and note in editor
    published = alice_client.post(f"/api/reports/{report}/publish", **api)
    assert published.status_code == 201, published.content
    assert note in _get(alice_client, reverse("report-detail", args=[report])).content.decode()


def test_intact_chunks_read_as_before_beside_a_damaged_one(two_runs):
    _, damaged, intact = two_runs
    whole = series.by_run([damaged.pk, intact.pk], METRIC, with_time=True)
    _set(damaged, 0, "value_data", b"\xde\xad\xbe\xef")
    found: list[series.Damage] = []
    read = series.by_run([damaged.pk, intact.pk], METRIC, with_time=True, damaged=found)
    assert [(d.run_id, d.name, d.chunk) for d in found] == [(damaged.pk, METRIC, 0)]
    assert "values do not decode" in found[0].reason
    for a, b in zip(read[intact.pk], whole[intact.pk], strict=True):
        assert np.array_equal(a, b), "the intact run reads bit for bit as before"
    steps = whole[damaged.pk][0]
    tail = steps >= packing.CHUNK_STEPS
    assert np.array_equal(read[damaged.pk][0], steps[tail]) and np.array_equal(
        read[damaged.pk][1], whole[damaged.pk][1][tail]
    ), "the damaged run keeps its other chunk"
    with pytest.raises(packing.Damaged):
        series.by_run([damaged.pk], METRIC)
