"""Migrations 0018 and 0019 use the packing frozen beside them (`experiments/migrations/_packing_0018.py`),
not the live `experiments.packing`: what they wrote stays readable by today's code and the other way
round, and their summaries agree with today's (the sums to the last bits: numpy's pairwise sum
then, the points added in step order now)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from experiments import packing
from experiments.migrations import _packing_0018 as frozen

MIGRATIONS = Path(packing.__file__).parent / "migrations"


def _points(seed: int, n: int, chunk: int = 0):
    rng = np.random.default_rng(seed)
    base = chunk << packing.CHUNK_BITS
    steps = np.sort(rng.choice(packing.CHUNK_STEPS, size=n, replace=False)).astype(np.int64) + base
    values = rng.normal(size=n) * 10.0 ** rng.integers(-5, 5, size=n)
    values[rng.random(n) < 0.1] = np.nan
    values[rng.random(n) < 0.05] = np.inf
    times = 1_700_000_000_000_000 + np.cumsum(rng.integers(-5, 10**7, size=n))
    return steps, values, times


def test_the_migrations_import_the_frozen_packing_not_the_live_module():
    for name in ("0018_metric_chunks.py", "0019_summary_tail_binary.py"):
        tree = ast.parse((MIGRATIONS / name).read_text())
        imported = {
            (node.module, alias.name)
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        assert ("experiments.migrations", "_packing_0018") in imported, name
        assert not any(module == "experiments" and alias == "packing" for module, alias in imported), name
        assert not any(module == "experiments.packing" for module, _ in imported), name


@pytest.mark.parametrize(("seed", "chunk"), [(0, 0), (1, -3), (2, 7), (3, packing.chunk_of(2**40))])
def test_chunks_the_migration_packs_decode_as_today_and_back(seed, chunk):
    steps, values, times = _points(seed, 300, chunk)
    written = (frozen.pack_steps(chunk, steps), frozen.pack_values(values), frozen.pack_times(times))
    for got, want in zip(
        packing.decode(chunk, True, *written, count=300), (steps, values, times), strict=True
    ):
        assert np.array_equal(got.view(np.int64), want.view(np.int64)), "every bit, NaN included"
    for packed in (True, False):
        today = packing.encode(chunk, steps, values, times, packed=packed)
        back = frozen.decode(chunk, packed, *today)
        assert all(
            np.array_equal(g.view(np.int64), w.view(np.int64))
            for g, w in zip(back, (steps, values, times), strict=True)
        )
    assert [(c, (s.start, s.stop)) for c, s in frozen.split(steps)] == [
        (c, (s.start, s.stop)) for c, s in packing.split(steps)
    ]
    assert frozen.unpack_tail(packing.pack_tail([1.5, -2.0])) == [1.5, -2.0]
    assert packing.unpack_tail(frozen.pack_tail([1.5, -2.0])) == [1.5, -2.0]


@pytest.mark.parametrize("seed", range(4))
def test_the_migration_s_summaries_agree_with_today_s(seed):
    steps, values, _ = _points(seed, int(np.random.default_rng(seed).integers(1, 400)))
    then, now = frozen.summarise(steps, values), packing.summarise(steps, values)
    assert then.keys() == now.keys() == set(packing.SUMMARY_FIELDS)
    for field in packing.SUMMARY_FIELDS:
        if field in ("total", "area") and now[field] is not None:
            assert then[field] == pytest.approx(now[field], rel=1e-9, abs=1e-12), field
        else:
            assert then[field] == now[field], field
    empty = packing.summarise(np.empty(0, np.int64), np.empty(0))
    assert frozen.summarise(np.empty(0, np.int64), np.empty(0)) == empty == packing.empty_summary()
