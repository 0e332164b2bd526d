"""Metric series in chunks (`experiments.packing`, `experiments.series`): points come back exactly as
logged (NaN and ±infinity kept, shown as gaps), a step logged again replaces its point, summaries
kept up to date as points arrive equal the summary of the whole series, and bad input (huge and
negative steps, a name at the length limit) is stored and shown, never a 500."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from django.db import IntegrityError, transaction
from support import log_points, logged

from dashboards.comparison import curves
from experiments import packing, series
from experiments.models import MetricChunk, MetricSummary

START = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def test_a_chunk_unpacks_to_what_was_packed_bit_for_bit():
    rng = np.random.default_rng(1)
    for chunk in (-3, 0, 7, packing.chunk_of(2**40)):
        base = chunk << packing.CHUNK_BITS
        steps = np.sort(rng.choice(packing.CHUNK_STEPS, size=300, replace=False)) + base
        values = rng.normal(size=300) * 10.0 ** rng.integers(-300, 300, size=300)
        values[[3, 4, 5]] = [np.nan, np.inf, -np.inf]
        times = packing.micros(START) + np.cumsum(rng.integers(-5, 10**7, size=300))
        assert np.array_equal(packing.unpack_steps(chunk, packing.pack_steps(chunk, steps)), steps)
        assert np.array_equal(
            packing.unpack_values(packing.pack_values(values)).view(np.int64), values.view(np.int64)
        ), "every bit of every float, NaN included"
        assert np.array_equal(packing.unpack_times(packing.pack_times(times)), times)


def test_consecutive_steps_pack_to_their_first_and_count():
    for chunk, first, n in ((0, 1, 1023), (5, 0, 1024), (-2, 17, 1)):
        steps = np.arange(first, first + n) + (chunk << packing.CHUNK_BITS)
        data = packing.pack_steps(chunk, steps)
        assert len(data) == 5 and np.array_equal(packing.unpack_steps(chunk, data), steps)
    gap = np.array([0, 1, 3])
    assert len(packing.pack_steps(0, gap)) > 5 and packing.unpack_steps(
        0, packing.pack_steps(0, gap)
    ).tolist() == [0, 1, 3]


def test_sorted_steps_split_into_their_chunks():
    steps = np.array([-1025, -1, 0, 5, 1023, 1024, 3000, 2**40], dtype=np.int64)
    parts = list(packing.split(steps))
    assert [chunk for chunk, _ in parts] == [-2, -1, 0, 1, 2, 2**30]
    assert [steps[part].tolist() for _, part in parts] == [
        [-1025],
        [-1],
        [0, 5, 1023],
        [1024],
        [3000],
        [2**40],
    ]
    assert list(packing.split(np.array([7], dtype=np.int64))) == [(0, slice(0, 1))]


def test_wall_times_keep_their_microseconds():
    for wall in (START, datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC)):
        assert packing.wall_time(packing.micros(wall)) == wall


def test_steps_beyond_64_bit_chunks_are_refused_naming_the_rule():
    packing.check_step(-(2**62))
    with pytest.raises(ValueError, match=r"step must be in \[-2\*\*62, 2\*\*62\)"):
        packing.check_step(2**62)


def _summary_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], float):
            assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-9), key
        elif key == "tail":
            assert a[key] == pytest.approx(b[key], rel=1e-12), key
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize("seed", range(6))
def test_a_summary_extended_piece_by_piece_equals_the_summary_of_the_whole(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 400))
    steps = np.cumsum(rng.integers(1, 30, size=n)) - 50
    values = rng.normal(size=n)
    values[rng.random(n) < 0.2] = np.nan
    values[rng.random(n) < 0.05] = np.inf
    cuts = sorted(set(rng.integers(1, n, size=4).tolist()))
    summary = None
    for part in np.split(np.arange(n), cuts):
        if summary is None:
            summary = packing.summarise(steps[part], values[part])
        else:
            summary = packing.extend(summary, steps[part], values[part])
    _summary_equal(summary, packing.summarise(steps, values))


def test_a_summary_answers_as_the_comparison_rules_do():
    steps = np.arange(1, 51)
    values = np.sin(steps / 7.0)
    summary = packing.summarise(steps, values)
    s = curves.Series.of(steps.astype(float), values)
    assert packing.auc(summary) == pytest.approx(curves.final_value(s, "auc"))
    assert packing.mean_last(summary, 10) == pytest.approx(curves.final_value(s, "mean_last_k", 10))
    assert summary["max"] == curves.final_value(s, "best") and summary["last"] == curves.final_value(
        s, "last"
    )
    with pytest.raises(ValueError, match="k must be in 1..10"):
        packing.mean_last(summary, 11)


pytestmark = pytest.mark.django_db


def test_points_come_back_as_logged_and_a_step_logged_again_replaces_its_point(make_run):
    run = make_run()
    first = [("loss", step, 1.0 / step, START + timedelta(seconds=step)) for step in range(1, 2500)]
    log_points(run, first)
    assert MetricChunk.objects.filter(run=run, name="loss").count() == 3  # steps 1–1023, 1024–2047, 2048–2499
    again = [("loss", step, -1.0, START) for step in (5, 1024, 2499)] + [("loss", 3000, 7.0, START)]
    log_points(run, again)

    steps, values, times = series.series(run.pk, "loss")
    assert steps.tolist() == [*range(1, 2500), 3000]
    expected = {step: 1.0 / step for step in range(1, 2500)} | {5: -1.0, 1024: -1.0, 2499: -1.0, 3000: 7.0}
    assert values.tolist() == [expected[s] for s in steps.tolist()]
    assert (
        packing.wall_time(times[0]) == START + timedelta(seconds=1) and packing.wall_time(times[4]) == START
    )
    summary = MetricSummary.objects.get(run=run, name="loss")
    assert (summary.count, summary.last_step, summary.last, summary.min) == (2500, 3000, 7.0, -1.0)
    assert summary.mean == pytest.approx(np.mean(values))


def test_nan_infinity_huge_and_negative_steps_and_a_name_at_the_limit_are_stored_and_shown(
    make_run, client, alice, token
):
    run = make_run()
    name = "m" * 100
    log_points(
        run,
        [
            (name, -(2**40), float("nan"), START),
            (name, -1, float("inf"), START),
            (name, 0, float("-inf"), START),
            (name, 2**40, 2.5, START),
            (name, 2**61, 1e308, START),
        ],
    )
    steps, values, _ = series.series(run.pk, name)
    assert steps.tolist() == [-(2**40), -1, 0, 2**40, 2**61]
    assert math.isnan(values[0]) and values[1] == math.inf and values[2] == -math.inf, "kept as logged"
    assert logged(run) == [
        (name, s, v) for s, v in zip(steps.tolist(), [None, None, None, 2.5, 1e308], strict=True)
    ]
    summary = MetricSummary.objects.get(run=run, name=name)
    assert (summary.count, summary.finite, summary.first, summary.last, summary.max) == (
        5,
        2,
        2.5,
        1e308,
        1e308,
    )

    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    response = client.get(f"/api/runs/{run.pk}/metrics", **auth)
    assert response.status_code == 200
    assert response.json()["metrics"][name] == [
        [-(2**40), None],
        [-1, None],
        [0, None],
        [2**40, 2.5],
        [2**61, 1e308],
    ]
    csv = client.get(f"/api/runs/{run.pk}/metrics", {"format": "csv"}, **auth).content.decode().splitlines()
    assert csv[1:3] == [f"{name},{-(2**40)},,{START.isoformat()},", f"{name},-1,,{START.isoformat()},"]
    client.force_login(alice)
    for page in (f"/runs/{run.pk}/", f"/runs/{run.pk}/curves"):
        assert client.get(page).status_code == 200, page


def test_one_chunk_row_per_run_metric_and_chunk(make_run):
    run = make_run()
    log_points(run, [("loss", 1, 0.5, START)])
    row = MetricChunk.objects.get(run=run)
    with pytest.raises(IntegrityError), transaction.atomic():
        MetricChunk.objects.create(
            run=run, name="loss", chunk=row.chunk, count=1, step_data=b"", value_data=b"", time_data=b""
        )


def test_summaries_follow_a_series_logged_out_of_order(make_run):
    run = make_run()
    rng = np.random.default_rng(3)
    steps = rng.permutation(np.arange(0, 3000, 3))
    values = rng.normal(size=len(steps))
    for part in np.array_split(np.arange(len(steps)), 7):
        log_points(run, [("m", int(steps[i]), float(values[i]), START) for i in part])
    order = np.argsort(steps)
    summary = series.stored_summaries(run.pk, ["m"])["m"]
    _summary_equal(summary, packing.summarise(steps[order], values[order]))


def test_a_series_newest_chunk_stays_raw_while_it_grows_and_is_packed_when_passed_or_sealed(make_run):
    run = make_run()
    log_points(run, [("loss", step, step / 7, START) for step in range(1, 1000)])
    assert list(MetricChunk.objects.filter(run=run).values_list("chunk", "packed")) == [(0, False)]
    log_points(run, [("loss", 1500, 2.0, START)])  # past chunk 0, which is packed now
    assert list(MetricChunk.objects.filter(run=run).values_list("chunk", "packed")) == [(0, True), (1, False)]
    before = series.series(run.pk, "loss")
    assert series.seal(run.pk) == 1 and series.seal(run.pk) == 0
    assert not MetricChunk.objects.filter(run=run, packed=False).exists()
    after = series.series(run.pk, "loss")
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    assert after[0].tolist() == [*range(1, 1000), 1500]


def test_a_writer_stores_what_append_stores_flush_by_flush(make_run):
    """The sink's `Writer`: new steps extend what it knows without reading; a step again, an
    older one or a new series go through `append`; after a failed write it starts from the database."""
    mine, reference = make_run("writer"), make_run("append")
    writer = series.Writer(mine.pk)
    rng = np.random.default_rng(5)
    flushes = [list(range(lo, lo + 7)) for lo in range(0, 2300, 7)]
    flushes[40] = [3, 100, 2, 150]  # a resumed attempt's steps again, out of order
    for i, steps in enumerate(flushes):
        values = rng.normal(size=len(steps))
        values[rng.random(len(steps)) < 0.1] = np.nan
        points = [
            (name, s, float(v), START + timedelta(microseconds=s))
            for s, v in zip(steps, values, strict=True)
            for name in ("a", "b")
        ]
        if i == 100:
            points.append(("late", 5, 1.0, START))
        with transaction.atomic():
            writer.write(points)
        if i == 200:
            writer.forget()  # as after a failed flush
        else:
            writer.committed()
        log_points(reference, points)
    for name in ("a", "b", "late"):
        got, want = series.series(mine.pk, name), series.series(reference.pk, name)
        assert all(np.array_equal(g, w, equal_nan=True) for g, w in zip(got, want, strict=True)), name
        _summary_equal(
            series.stored_summaries(mine.pk, [name])[name],
            series.stored_summaries(reference.pk, [name])[name],
        )

    def layout(run):
        return list(MetricChunk.objects.filter(run=run).values_list("name", "chunk", "part", "packed"))

    newest = [row for row in layout(mine) if row[1] == 2]
    assert [row[2:] for row in newest if row[0] == "a"] == [(p, False) for p in range(len(newest) // 2)]
    assert len(newest) > 2, "the newest chunk grew by parts, one a flush"
    passed = [row for row in layout(mine) if row[0] in ("a", "b") and row[1] < 2]
    assert passed and all(row[2:] == (0, True) for row in passed), "the chunks it moved past: packed, whole"
    series.seal(mine.pk), series.seal(reference.pk)
    assert layout(mine) == layout(reference) == [(n, c, 0, True) for n, c, _, _ in layout(reference)]
