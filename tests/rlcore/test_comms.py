"""FSDP2's collectives between trainer ranks (`rlcore.comms`): through shared memory (ranks of one
host) and as point-to-point sends, each equal to gloo's own all-gather and reduce-scatter, back to
back with a rank slow to read, sends where /dev/shm cannot hold the arena, and nothing left in
/dev/shm; real torchrun ranks."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from rlcore import launch

ROOT = Path(__file__).resolve().parents[2]
TARGET = Path(__file__).resolve().with_name("comms_target.py")


def shm_files() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("rlcore-ranks-")}


@pytest.mark.parametrize(
    ("transport", "ranks", "kinds", "shared_memory"),
    [
        ("shared", 2, ["SharedAllGather", "SharedReduceScatter"], True),
        ("shared", 3, ["SharedAllGather", "SharedReduceScatter"], True),
        ("full", 2, ["SharedAllGather", "SharedReduceScatter"], False),  # /dev/shm too small: sends
        ("pairwise", 2, ["PairwiseAllGather", "PairwiseReduceScatter"], False),
    ],
)
def test_the_collectives_equal_gloos_and_leave_nothing_behind(
    tmp_path, transport, ranks, kinds, shared_memory
):
    before = shm_files()
    command = launch.rank_command([TARGET, tmp_path, transport], ranks)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LAB_RANK_TIMEOUT_S": "120"}
    done = subprocess.run(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-8000:]
    for rank in range(ranks):
        report = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert report["kinds"] == kinds
        assert len(report["cases"]) == 5
        assert report["back_to_back"]
        assert report["shared_memory"] is shared_memory
        for case in report["cases"]:
            assert case["reduce_scatter"] and case["all_gather"] and case["in_place"], case
    assert shm_files() <= before
