"""How the worker reads its ranks' failures (`workers.ranks.failure`, `as_raised`), from the files
the ranks leave in the attempt's folder: which failure re-queues the run and which fails it."""

from __future__ import annotations

import json
import time

from workers.ranks import OUTPUT, RanksFailed, as_raised, failure
from workers.source import BufferDamaged


def leave_error(folder, rank: int, exc: BaseException, at: float) -> None:
    """What `workers.ranks.main` writes when rank `rank` raises `exc`."""
    error = {"rank": rank, "type": type(exc).__name__, "error": f"{type(exc).__name__}: {exc}", "time": at}
    (folder / f"error-rank{rank}.json").write_text(json.dumps(error))


def test_rank_zero_s_damaged_buffer_re_queues_the_run_as_in_one_process(tmp_path):
    (tmp_path / OUTPUT).write_text("")
    now = time.time()
    leave_error(tmp_path, 0, BufferDamaged("the batch of step 4 was given up"), now)
    leave_error(tmp_path, 1, RuntimeError("Connection closed by peer"), now + 0.5)  # follows from it
    failed = failure(tmp_path, 1)
    assert (failed.rank, failed.error_type) == (0, "BufferDamaged")
    raised = as_raised(failed)
    assert isinstance(raised, BufferDamaged)
    assert "trainer rank 0 failed: BufferDamaged: the batch of step 4 was given up" in str(raised)


def test_only_rank_zero_s_own_buffer_damage_re_queues(tmp_path):
    """By the error's type, not its text: a rank 0 error whose message merely reads like one, or
    another rank's, fails the attempt."""
    (tmp_path / OUTPUT).write_text("")
    leave_error(tmp_path, 0, ValueError("BufferDamaged: quoted in a config error"), time.time())
    raised = as_raised(failure(tmp_path, 1))
    assert type(raised) is RanksFailed and "rank 0" in str(raised)

    other = tmp_path / "other"
    other.mkdir()
    (other / OUTPUT).write_text("")
    leave_error(other, 1, BufferDamaged("not rank 0's"), time.time())
    raised = as_raised(failure(other, 1))
    assert type(raised) is RanksFailed and raised.rank == 1
