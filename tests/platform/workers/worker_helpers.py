"""What the worker tests share besides fixtures: comparing a run's curves with its twin's, waiting
for runs to end, damaging a file, and a jsonl dataset under the test data root."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import TEST_VAR, TINY_CONFIG, logged, wait_for

from experiments.models import Run
from rlcore.sinks import EVAL_METRICS, MISMATCH_METRICS, STEP_METRICS

# Every metric a run and its twin log alike (wall-clock times and rates differ).
COMPARED = [
    name for name in (*STEP_METRICS, *MISMATCH_METRICS, *EVAL_METRICS) if not name.startswith("time/")
]
COMPARED.remove("tokens_per_s")


def curves(run: Run) -> dict[tuple[str, int], float]:
    return {(name, step): value for name, step, value in logged(run) if name in COMPARED}


def assert_curves_equal(run: Run, twin: Run) -> None:
    mine, reference = curves(run), curves(twin)
    assert set(mine) == set(reference)
    for key, value in reference.items():
        assert mine[key] == pytest.approx(value, abs=1e-5, rel=0), key


def wait_until_over(runs, timeout_s: float) -> None:
    ids = [run.pk for run in runs]
    wait_for(
        lambda: not Run.objects.filter(pk__in=ids, status__in=Run.ACTIVE).exists(),
        timeout_s,
        f"runs {ids} to end",
        interval_s=0.5,
    )


def damage(path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    path.write_bytes(bytes(data))


def write_dataset(name: str, answer_of=lambda a: 2 * a) -> Path:
    """A GSM8k-style jsonl file under the test data root: "What is a+a?" with `answer_of(a)`."""
    path = TEST_VAR / "data" / name
    path.parent.mkdir(parents=True, exist_ok=True)  # a fresh checkout, the test run alone
    lines = [
        {"question": f"What is {a}+{a}?", "answer": f"{a}+{a}={2 * a} #### {answer_of(a)}"}
        for a in range(1, 41)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def jsonl_config(path: Path, **changes) -> dict:
    return {
        **TINY_CONFIG,
        "task": {"name": "jsonl", "path": str(path), "held_out": 8},
        "eval_size": 8,
        **changes,
    }
