"""Starting a run's trainer processes: `start_ranks` runs `torchrun --nnodes 1 --nproc-per-node N`
on `python -m rlcore rank CONFIG` (or another entry module: the training worker's is
`workers.ranks`), with an explicit rendezvous on 127.0.0.1 (a free port and a
fresh id, so two runs on one host never meet), in a process group of its own, with the threads
of each rank set (the usable cores ÷ N unless given). Linux sends torchrun SIGKILL when the
thread that started it dies (PR_SET_PDEATHSIG), and each rank SIGKILL when torchrun dies, so no
rank outlives whoever started it. The command line uses it; so can a worker that starts a run.
Importing this module imports neither torch nor CUDA."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

PR_SET_PDEATHSIG = 1


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def threads_per_rank(processes: int, cores: int | None = None) -> int:
    """The threads each of `processes` ranks gets on the CPU: the cores ÷ the ranks, at least 1."""
    return max(1, (cores or usable_cores()) // processes)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the parent thread dies (Linux; nothing elsewhere).
    Not SIGTERM: torchrun would then stop its ranks gently, waiting up to 30 s on a rank inside a
    collective; killed, it takes each rank with it at once (their own parent-death signal)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def rlcore_rank(
    config_path: Path | str,
    *,
    out: Path | str | None = None,
    checkpoint_dir: Path | str | None = None,
    cache_dir: Path | str | None = None,
) -> list[str]:
    """What each rank of the run in `config_path` runs under `python -m rlcore run`: the internal
    `rank` command (rank 0 writes the metrics to `out`, the checkpoints go to `checkpoint_dir`)."""
    entry = ["-m", "rlcore", "rank", str(config_path)]
    for flag, value in (("--out", out), ("--checkpoint-dir", checkpoint_dir), ("--cache-dir", cache_dir)):
        if value is not None:
            entry += [flag, str(value)]
    return entry


def rank_command(
    entry: Sequence[str],
    processes: int,
    *,
    log_dir: Path | str | None = None,
    port: int | None = None,
    rdzv_id: str | None = None,
) -> list[str]:
    """The torchrun command line that starts `processes` ranks, each running `entry` (what follows
    `python`: `-m module args…` as `rlcore_rank` gives, or a script and its arguments)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(processes),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port or free_port()}",
        "--rdzv-id",
        rdzv_id or uuid.uuid4().hex,
        "--max-restarts",
        "0",
    ]
    if log_dir is not None:  # each rank's output in its own file, rank 0's shown too
        command += ["--log-dir", str(log_dir), "--redirects", "3", "--tee", "3", "--local-ranks-filter", "0"]
    return [*command, *map(str, entry)]


def start_ranks(
    entry: Sequence[str],
    processes: int,
    *,
    log_dir: Path | str | None = None,
    threads: int | None = None,
    env: Mapping[str, str] | None = None,
    **popen: object,
) -> subprocess.Popen:
    """Start torchrun with `processes` ranks each running `entry` (`rank_command`); return its
    `Popen`. It runs in its own process group (`os.killpg(proc.pid, …)` ends torchrun and its
    ranks) and is SIGKILLed when the calling thread dies, so call this from a thread that lives
    as long as the run. `threads` per rank: default the usable cores ÷ `processes`. `env` is
    added to this process's environment; other keyword arguments go to `Popen` (stdout, stderr,
    cwd)."""
    threads = threads or threads_per_rank(processes)
    environment = {**os.environ, **(env or {})}
    environment.update(OMP_NUM_THREADS=str(threads), LAB_RANK_THREADS=str(threads))
    return subprocess.Popen(
        rank_command(entry, processes, log_dir=log_dir),
        env=environment,
        start_new_session=True,
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        **popen,
    )


def stop_ranks(proc: subprocess.Popen, grace_s: float = 10.0) -> int:
    """End torchrun and every rank (SIGTERM to its process group, SIGKILL after `grace_s`);
    return its exit status."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()
