"""Workers sharing a machine: N workers, each with `LAB_TORCH_THREADS` = cores // N (the default
when `make up` starts N workers), finish N short runs no slower than one worker with all the
cores running them in turn.

A run is the real `rlcore.trainer.train` on `examples/arithmetic.yaml` made short (`--steps`
steps, 8 held-out problems evaluated before and after, no checkpoints), run i with seed i. The
model is the example's tiny Llama, warm-started for at most `--warmstart-steps` supervised steps
(the example allows 3,000, minutes on 2 busy cores): the bench times training, not learning,
and the model's shape, hence the work per step, is the example's.
A worker is a subprocess set up the way `make up` sets up a worker process: OMP_NUM_THREADS and
MKL_NUM_THREADS in its environment, then `torch.set_num_threads` and
`torch.set_num_interop_threads` before any work. The same N runs go through three schedules:

- sequential (the reference): one worker with threads = cores runs them one after another;
- shared: N workers at once, one run each, threads = cores // N each (at least 1);
- oversubscribed: N workers at once with torch's default threads each (nothing set), what
  workers did before `LAB_TORCH_THREADS`; shown so the reader sees what the setting prevents.

A worker imports torch and rlcore, then waits at a barrier; the clock covers only training (a
real worker imports once and then trains run after run), from the barrier to the end of the
schedule's last run. The tiny model is warm-started into the shared cache before the first
round, so no run measures the warm-start. Rounds run the three schedules in a rotating order.
The machines are shared, so each schedule waits for an idle machine first and measures the CPU
other processes used while it ran; contended rounds are reported but left out, a schedule still
running after `--limit-s` is stopped (oversubscription under contention can take minutes), and
rounds run until `--rounds` clean ones or the time budget is spent. The medians of the per-round ratios
(schedule / sequential) go into this benchmark's section of `BENCHMARKS.md`; the exit code is 0
on PASS (shared / sequential ≤ 1 + `--margin`), 1 on FAIL and 2 when too few rounds were
uncontended to decide.

    .venv/bin/python bench/worker_threads.py            # or: make bench
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from report import machine  # bench/report.py, beside this script

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "arithmetic.yaml"
SECTION = "## Workers sharing a machine's cores (`bench/worker_threads.py`)"
SCHEDULES = ("sequential", "shared", "oversubscribed")
EVAL_SIZE = 8
# Other processes' CPU use (in cores) above which a schedule is contended and its round left out.
MAX_OTHERS = 0.15
IDLE_WAIT_S = 30
READY = "worker-ready"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy since boot (as workers measure runs)."""
    from workers import measure

    return measure.machine_busy_s()


def others_cores_now(seconds: float = 1.0) -> float:
    """CPU cores used by other processes over the next `seconds` (this one only sleeps)."""
    busy, own, start = machine_busy_s(), time.process_time(), time.monotonic()
    time.sleep(seconds)
    return max(0.0, machine_busy_s() - busy - (time.process_time() - own)) / (time.monotonic() - start)


def wait_until_idle() -> None:
    deadline = time.monotonic() + IDLE_WAIT_S
    while others_cores_now() > MAX_OTHERS and time.monotonic() < deadline:
        pass


def bench_config(steps: int, seed: int, warmstart_steps: int):
    """The example's settings, run for `steps` steps on the CPU, with as little eval as allowed."""
    from rlcore import config

    data = config.load(EXAMPLE).model_dump()
    data["model"]["tiny"]["warmstart_max_steps"] = warmstart_steps
    data.update(
        steps=steps,
        eval_every=0,
        eval_size=EVAL_SIZE,
        checkpoint_every=0,
        samples_per_step=0,
        device="cpu",
        seed=seed,
    )
    return config.RunConfig.model_validate(data)


# ---- inside a worker subprocess -------------------------------------------------------------


def worker_main(args: argparse.Namespace) -> None:
    """Set threads like a worker, wait at the barrier, train the given seeds in turn, report."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
        torch.set_num_interop_threads(args.threads)
    from rlcore.sinks import ListSink
    from rlcore.trainer import train

    configs = [bench_config(args.steps, seed, args.warmstart_steps) for seed in args.seeds]
    print(READY, flush=True)
    sys.stdin.readline()
    start, cpu = time.monotonic(), time.process_time()
    for config in configs:
        train(config, ListSink(), cache_dir=args.cache_dir)
    result = {
        "start": start,
        "end": time.monotonic(),
        "cpu": time.process_time() - cpu,
        "threads": torch.get_num_threads(),
        "interop": torch.get_num_interop_threads(),
    }
    # Written whole, then renamed: the driver ends its window as soon as every result is there,
    # so the interpreter's exit does not count as another process's CPU.
    partial = args.result.with_suffix(".partial")
    partial.write_text(json.dumps(result))
    partial.rename(args.result)


def warm_main(args: argparse.Namespace) -> None:
    from rlcore import models, tasks

    config = bench_config(args.steps, 0, args.warmstart_steps)
    print(models.tiny_model_path(config, tasks.build(config.task), args.cache_dir), flush=True)


# ---- the driver ------------------------------------------------------------------------------


def times(ratio: float) -> str:
    return "n/a" if math.isnan(ratio) else f"{ratio:.2f}×"


@dataclass
class Timing:
    schedule: str
    seconds: float  # from the barrier to the end of the last run
    others: float  # CPU cores other processes used meanwhile
    threads: list[int]  # torch threads each worker actually had

    @property
    def clean(self) -> bool:
        """Uncontended; a schedule stopped at the limit never counts (its others count is unknown)."""
        return self.others <= MAX_OTHERS and math.isfinite(self.seconds)

    def cell(self, args: argparse.Namespace) -> str:
        return f"{self.seconds:.2f}" if math.isfinite(self.seconds) else f"> {args.limit_s:.0f} (stopped)"

    def ratio_cell(self, reference: Timing) -> str:
        return times(self.seconds / reference.seconds) if math.isfinite(self.seconds) else "—"

    @property
    def others_cell(self) -> str:
        return "—" if math.isnan(self.others) else f"{self.others:.2f}{'' if self.clean else ' ✗'}"

    @property
    def threads_cell(self) -> str:
        return "+".join(str(n or "default") for n in self.threads)


def worker_env(threads: int | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


def run_schedule(schedule: str, workers: int, cores: int, args: argparse.Namespace) -> Timing:
    """Start the schedule's workers, wait until all are ready and the machine idle, time them."""
    seeds = list(range(workers))
    if schedule == "sequential":
        plan = [(cores, seeds)]
    elif schedule == "shared":
        plan = [(max(1, cores // workers), [seed]) for seed in seeds]
    else:
        plan = [(None, [seed]) for seed in seeds]
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for i, (threads, run_seeds) in enumerate(plan):
            command = [sys.executable, __file__, "--worker", "--steps", str(args.steps)]
            command += ["--warmstart-steps", str(args.warmstart_steps)]
            command += ["--seeds", ",".join(map(str, run_seeds)), "--result", f"{tmp}/{i}.json"]
            command += ["--threads", str(threads or 0)]
            if args.cache_dir:
                command += ["--cache-dir", str(args.cache_dir)]
            log = open(f"{tmp}/{i}.log", "w")  # noqa: SIM115 - closed with the process below
            procs.append(
                (
                    subprocess.Popen(
                        command,
                        cwd=ROOT,
                        env=worker_env(threads),
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=log,
                        text=True,
                    ),
                    log,
                )
            )
        try:
            for proc, _ in procs:
                while (line := proc.stdout.readline()) and line.strip() != READY:
                    pass
                if not line:
                    raise RuntimeError(f"a {schedule} worker exited before it was ready")
            wait_until_idle()
            busy, own, start = machine_busy_s(), time.process_time(), time.monotonic()
            for proc, _ in procs:
                proc.stdin.write("go\n")
                proc.stdin.flush()
            results = [Path(f"{tmp}/{i}.json") for i in range(len(procs))]
            while not all(r.exists() for r in results) and all(p.poll() in (None, 0) for p, _ in procs):
                if time.monotonic() - start > args.limit_s:
                    break
                time.sleep(0.05)
            wall = time.monotonic() - start
            others_busy = machine_busy_s() - busy - (time.process_time() - own)
            finished = all(r.exists() for r in results)
            if finished:
                for proc, _ in procs:
                    proc.wait(30)
        finally:
            for proc, log in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                log.close()
        codes = [proc.returncode for proc, _ in procs]
        if not finished and not any(code > 0 for code in codes):
            # Stopped at the limit: slow enough to tell, and the time budget is kept.
            return Timing(schedule, math.inf, math.nan, [p[0] or 0 for p in plan])
        if any(codes):
            logs = "\n".join(Path(f"{tmp}/{i}.log").read_text()[-3000:] for i in range(len(procs)))
            raise RuntimeError(f"a {schedule} worker failed (exits {codes}):\n{logs}")
        results = [json.loads(r.read_text()) for r in results]
    seconds = max(r["end"] for r in results) - min(r["start"] for r in results)
    others = max(0.0, others_busy - sum(r["cpu"] for r in results)) / wall
    return Timing(schedule, seconds, others, [r["threads"] for r in results])


def ratios(rounds: list[dict[str, Timing]], schedule: str) -> list[float]:
    """schedule / sequential per round, over the rounds where every schedule ran uncontended."""
    return [r[schedule].seconds / r["sequential"].seconds for r in rounds if all(t.clean for t in r.values())]


def verdict(rounds: list[dict[str, Timing]], args: argparse.Namespace) -> tuple[float, float, str]:
    shared, over = ratios(rounds, "shared"), ratios(rounds, "oversubscribed")
    shared_median = statistics.median(shared) if shared else math.nan
    over_median = statistics.median(over) if over else math.nan
    if len(shared) < args.rounds:
        return shared_median, over_median, "INCONCLUSIVE"
    return shared_median, over_median, "PASS" if shared_median <= 1 + args.margin else "FAIL"


def report(rounds: list[dict[str, Timing]], workers: int, cores: int, args: argparse.Namespace):
    """The markdown section and the verdict."""
    shared, over, outcome = verdict(rounds, args)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    run = bench_config(args.steps, 0, args.warmstart_steps)
    ro = run.rollout
    threads = max(1, cores // workers)
    clean_reference = [r["sequential"].seconds for r in rounds if all(t.clean for t in r.values())]
    spread = max(clean_reference) / min(clean_reference) - 1 if clean_reference else math.nan
    lines = [
        SECTION,
        "",
        f"Measured {now} on {machine()}.",
        "",
        f"{workers} runs of `{EXAMPLE.relative_to(ROOT)}` made short: built-in tiny Llama "
        f"({run.model.tiny.hidden_size} wide, {run.model.tiny.num_layers} layers; warm-started for at most "
        f"{args.warmstart_steps} steps, once, into the shared cache before the first round), {args.steps} steps of {ro.prompts_per_step} prompts × "
        f"{ro.group_size} responses, `max_new_tokens` {ro.max_new_tokens}, {EVAL_SIZE} held-out problems "
        f"evaluated before and after, no checkpoints, seeds 0–{workers - 1}; the real `rlcore.trainer.train`.",
        "A worker is a subprocess with OMP_NUM_THREADS / MKL_NUM_THREADS in its environment, then",
        "`torch.set_num_threads` and `set_num_interop_threads` before any work, as `make up`'s workers do.",
        f"**sequential** (the reference): one worker, {cores} threads, runs them in turn; **shared**: {workers} "
        f"workers at once, {threads} thread{'s' if threads > 1 else ''} each (cores // workers, the default "
        f"`LAB_TORCH_THREADS` with {workers} workers); **oversubscribed**: {workers} workers at once with "
        "torch's default threads (none set; the count each had is shown).",
        "Time: from a barrier the workers wait at once torch and rlcore are imported (a worker imports once) to "
        'the end of the last run. "others" is the CPU (in cores) other processes used meanwhile; a round with',
        f"a schedule above {MAX_OTHERS} is contended, marked ✗ and left out, and so is one stopped after "
        f"{args.limit_s:.0f} s. Schedules rotate their order",
        "from round to round; ratios are per round, against that round's sequential time.",
        "",
        "| round | sequential s | others | shared s | others | shared / seq. | oversub. s | threads | "
        "others | oversub. / seq. |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rounds, start=1):
        seq, sh, ov = r["sequential"], r["shared"], r["oversubscribed"]

        lines.append(
            f"| {i} | {seq.cell(args)} | {seq.others_cell} | {sh.cell(args)} | {sh.others_cell} | "
            f"{sh.ratio_cell(seq)} | {ov.cell(args)} | {ov.threads_cell} | {ov.others_cell} | "
            f"{ov.ratio_cell(seq)} |"
        )
    lines += [
        f"| **median** | | | | | **{times(shared)}** | | | | **{times(over)}** |",
        "",
        f"Shared / sequential (median over uncontended rounds): **{times(shared)}**; target ≤ 1 + "
        f"{args.margin:.2f} (a margin for noise; the reference alone varied by "
        f"{'n/a' if math.isnan(spread) else f'{spread:.0%}'} across the uncontended rounds): **{outcome}**"
        + (f" (fewer than {args.rounds} uncontended rounds)." if outcome == "INCONCLUSIVE" else ".")
        + f" Oversubscribed / sequential: {times(over)}.",
        "",
    ]
    return "\n".join(lines), outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="workers (and runs) on the machine")
    parser.add_argument("--steps", type=int, default=20, help="trainer steps per run")
    parser.add_argument(
        "--warmstart-steps", type=int, default=100, help="supervised warm-start steps at most (cached)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="uncontended rounds wanted")
    parser.add_argument("--max-rounds", type=int, default=6, help="give up (INCONCLUSIVE) after this many")
    parser.add_argument("--budget-s", type=float, default=210, help="start no round after this many seconds")
    parser.add_argument("--limit-s", type=float, default=60, help="stop a schedule after this many seconds")
    parser.add_argument("--margin", type=float, default=0.10, help="allowed shared / sequential above 1")
    parser.add_argument("--cache-dir", type=Path, default=None, help="rlcore's tiny-model cache")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))  # run as a script, bench/ itself is on the path, not the repo
    if args.worker:
        worker_main(args)
        return 0
    if args.warm:
        warm_main(args)
        return 0

    began = time.monotonic()
    cores, workers = usable_cores(), args.workers
    warm = [sys.executable, __file__, "--warm", "--steps", str(args.steps)]
    warm += ["--warmstart-steps", str(args.warmstart_steps)]
    if args.cache_dir:
        warm += ["--cache-dir", str(args.cache_dir)]
    subprocess.run(warm, cwd=ROOT, env=worker_env(cores), check=True, capture_output=True)
    print(f"tiny model warm in the cache after {time.monotonic() - began:.0f} s", flush=True)
    rounds: list[dict[str, Timing]] = []
    while len(rounds) < args.max_rounds and len(ratios(rounds, "shared")) < args.rounds:
        spent = time.monotonic() - began
        if rounds and spent + spent / len(rounds) > args.budget_s:
            break
        order = SCHEDULES[len(rounds) % 3 :] + SCHEDULES[: len(rounds) % 3]
        done = {schedule: run_schedule(schedule, workers, cores, args) for schedule in order}
        rounds.append(done)
        print(
            f"round {len(rounds)}: "
            + ", ".join(
                f"{s} {t.seconds:.2f} s (threads {t.threads_cell}, others {t.others:.2f})"
                for s, t in done.items()
            ),
            flush=True,
        )
    section, outcome = report(rounds, workers, cores, args)
    from bench.report import write_section

    write_section(section)
    print(section)
    print(outcome, f"({time.monotonic() - began:.0f} s)")
    return {"PASS": 0, "FAIL": 1}.get(outcome, 2)


if __name__ == "__main__":
    sys.exit(main())
