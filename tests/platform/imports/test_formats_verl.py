"""verl's file logger lines, written here as verl's FileLogger writes them (`{"step", "data"}` per
line; orjson writes NaN as null), read back point by point."""

from __future__ import annotations

import json

import pytest

from imports.formats import DEFAULT_MAPPINGS, ImportFormatError, Point, map_points, read


def test_every_value_is_read_with_its_step_and_a_null_is_a_gap(tmp_path):
    path = tmp_path / "exp.jsonl"
    rows = [
        {"step": 1, "data": {"actor/pg_clipfrac": 0.125, "actor/ppo_kl": 0.01, "critic/score/mean": 0.5}},
        {"step": 2, "data": {"actor/pg_clipfrac": None, "actor/ppo_kl": 0.02, "critic/score/mean": 0.625}},
        {"step": 3, "data": {"val-core/acc": 0.75, "training/global_step": 3}},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run = read("verl", path)
    assert run.tool == "verl"
    assert run.points == [
        Point(1, "actor/pg_clipfrac", 0.125, None),
        Point(1, "actor/ppo_kl", 0.01, None),
        Point(1, "critic/score/mean", 0.5, None),
        Point(2, "actor/ppo_kl", 0.02, None),
        Point(2, "critic/score/mean", 0.625, None),
        Point(3, "val-core/acc", 0.75, None),
        Point(3, "training/global_step", 3.0, None),
    ]
    assert map_points(run.points[:3], DEFAULT_MAPPINGS["verl"]) == [
        Point(1, "clip_frac", 0.125, None),
        Point(1, "kl/behavior", 0.01, None),
        Point(1, "reward/mean", 0.5, None),
    ]


@pytest.mark.parametrize(
    ("content", "where", "rule"),
    [
        (b'{"step": 1, "data": {"a": 1}}\n{"step": 2, "da', "line 2", "not JSON"),
        (b'{"step": 1, "data": [1, 2]}\n', "line 1", '"data" is not an object'),
        (b'{"data": {"a": 1}}\n', "line 1", "step must be a non-negative integer"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "line 1", "binary data"),
    ],
)
def test_a_bad_file_is_refused_naming_the_line_and_the_rule(tmp_path, content, where, rule):
    path = tmp_path / "exp.jsonl"
    path.write_bytes(content)
    with pytest.raises(ImportFormatError) as error:
        read("verl", path)
    assert (error.value.where, error.value.path) == (where, str(path)) and rule in error.value.rule


def test_a_file_over_the_cap_is_refused(tmp_path):
    path = tmp_path / "exp.jsonl"
    path.write_text('{"step": 1, "data": {"a": 1}}\n' * 50)
    with pytest.raises(ImportFormatError, match="an import reads at most 100 bytes"):
        read("verl", path, max_bytes=100)
