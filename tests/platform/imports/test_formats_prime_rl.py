"""prime-rl's metrics.jsonl, written here line by line as its file monitor writes them
(`json.dumps({"step", "time", **metrics})` with non-finite values dropped), read back point by
point; and the mapping onto the lab's names."""

from __future__ import annotations

import json
import math

import pytest

from imports.formats import DEFAULT_MAPPINGS, TOOLS, ImportFormatError, Point, map_points, read


def write_lines(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_every_value_is_read_with_its_step_and_time_and_dropped_nan_is_a_gap(tmp_path):
    rows = [
        {"step": 1, "time": 1764800000.25, "loss/mean": 0.5, "entropy/all/mean": 1.25, "optim/lr": 1e-6},
        # prime-rl dropped this step's loss (it was NaN): a gap, never a zero.
        {"step": 2, "time": 1764800010.5, "entropy/all/mean": 1.125, "optim/lr": 1e-6},
        {"step": 3, "time": 1764800020.75, "loss/mean": 0.25, "entropy/all/mean": 1.0, "optim/lr": 2e-6},
        {"step": 3, "time": 1764800021.0, "reward/mean": 0.75, "off_policy/max": 2},
    ]
    run = read("prime-rl", write_lines(tmp_path / "metrics.jsonl", rows))
    assert run.tool == "prime-rl"
    assert run.points == [
        Point(1, "loss/mean", 0.5, 1764800000.25),
        Point(1, "entropy/all/mean", 1.25, 1764800000.25),
        Point(1, "optim/lr", 1e-6, 1764800000.25),
        Point(2, "entropy/all/mean", 1.125, 1764800010.5),
        Point(2, "optim/lr", 1e-6, 1764800010.5),
        Point(3, "loss/mean", 0.25, 1764800020.75),
        Point(3, "entropy/all/mean", 1.0, 1764800020.75),
        Point(3, "optim/lr", 2e-6, 1764800020.75),
        Point(3, "reward/mean", 0.75, 1764800021.0),
        Point(3, "off_policy/max", 2.0, 1764800021.0),
    ]
    losses = {p.step: p.value for p in run.points if p.name == "loss/mean"}
    assert losses == {1: 0.5, 3: 0.25}


def test_nan_and_inf_written_in_a_line_are_kept(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 4, "time": 10.0, "loss/mean": NaN, "optim/grad_norm": Infinity, "x": -Infinity}\n'
    )
    values = [p.value for p in read("prime-rl", path).points]
    assert math.isnan(values[0]) and values[1:] == [math.inf, -math.inf]


def test_mapping_names_the_lab_metrics_and_keeps_the_rest_under_imported(tmp_path):
    rows = [{"step": 1, "time": 5.0, "loss/mean": 0.5, "mismatch_kl/all/mean": 0.01, "progress/tokens": 900}]
    run = read("prime-rl", write_lines(tmp_path / "metrics.jsonl", rows))
    mapped = map_points(run.points, DEFAULT_MAPPINGS["prime-rl"])
    assert mapped == [
        Point(1, "loss", 0.5, 5.0),
        Point(1, "mismatch/k3", 0.01, 5.0),
        Point(1, "imported/progress/tokens", 900.0, 5.0),
    ]


def test_two_source_names_onto_one_lab_name_at_a_step_is_refused():
    points = [Point(1, "entropy/mean", 1.0, None), Point(1, "entropy/all/mean", 1.0, None)]
    with pytest.raises(
        ValueError, match="'entropy/mean' and 'entropy/all/mean' both map to 'entropy' at step 1"
    ):
        map_points(points, DEFAULT_MAPPINGS["prime-rl"])


def test_default_mappings_name_only_lab_metrics():
    from rlcore.sinks import ALL_METRICS

    assert set(DEFAULT_MAPPINGS) == set(TOOLS)
    for tool, mapping in DEFAULT_MAPPINGS.items():
        assert set(mapping.values()) <= set(ALL_METRICS), tool


@pytest.mark.parametrize(
    ("content", "where", "rule"),
    [
        (
            b'{"step": 1, "time": 1.0, "loss/mean": 0.5}\n{"step": 2, "time": 2.0, "loss/me',
            "line 2",
            "not JSON",
        ),
        (b'{"step": 1, "loss/mean": 0.5}\n[1, 2]\n', "line 2", "expected a JSON object, got list"),
        (b'{"time": 1.0, "loss/mean": 0.5}\n', "line 1", "step must be a non-negative integer"),
        (b'{"step": 1.5, "loss/mean": 0.5}\n', "line 1", "step must be a non-negative integer"),
        (b'{"step": 1, "time": "noon", "loss/mean": 0.5}\n', "line 1", "time must be a Unix time in seconds"),
        (b'{"step": 1, "loss/mean": 0.5}\n\x00\x01\x02\xff', "line 2", "binary data"),
        (b"", None, "holds no metric values"),
        (b"[" * 100_000 + b"]" * 100_000, "line 1", "JSON nested too deeply"),
    ],
)
def test_a_bad_file_is_refused_whole_naming_the_line_and_the_rule(tmp_path, content, where, rule):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(content)
    with pytest.raises(ImportFormatError) as error:
        read("prime-rl", path)
    assert error.value.where == where and rule in error.value.rule
    assert str(error.value).startswith("metrics.jsonl")


def test_a_file_over_the_cap_is_refused(tmp_path):
    path = write_lines(
        tmp_path / "metrics.jsonl", [{"step": s, "time": 1.0, "loss/mean": 0.5} for s in range(100)]
    )
    with pytest.raises(ImportFormatError, match="an import reads at most 1000 bytes"):
        read("prime-rl", path, max_bytes=1000)


def test_an_unknown_tool_is_refused(tmp_path):
    with pytest.raises(ImportFormatError, match="unknown tool 'comet'"):
        read("comet", tmp_path)
