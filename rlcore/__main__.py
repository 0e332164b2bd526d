"""Command line: `python -m rlcore run CONFIG.(yaml|json) [--out metrics.jsonl]`, `presets`, `schema`.

Heavy imports (torch, transformers) happen only inside `run`, so `presets` and `schema`
answer instantly. A config with `execution.train_processes` N > 1 starts N trainer ranks under
torchrun (`rlcore.launch`), each running the internal `rank` command.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from rlcore import config as run_config
from rlcore import presets
from rlcore.sinks import TRAINING, WARM_START, JsonlSink, Sample

DEFAULT_CACHE = Path("var/cache")


class ProgressSink:
    """Shows a progress bar with the phase, the latest reward and eval accuracy; tees into a JSONL file."""

    def __init__(self, total_steps: int, out: JsonlSink | None):
        from tqdm import tqdm

        self.bar = tqdm(total=total_steps, unit="step", dynamic_ncols=True)
        self.out = out

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.out:
            self.out.log(step, metrics)
        if step > 0:
            self.bar.update(step - self.bar.n)
        shown = {k: f"{metrics[k]:.3f}" for k in ("reward/mean", "eval/accuracy", "kl/init") if k in metrics}
        if shown:
            self.bar.set_postfix(shown, refresh=False)

    def sample(self, step: int, samples: list[Sample]) -> None:
        if self.out:
            self.out.sample(step, samples)

    def should_stop(self) -> bool:
        return False

    def flush(self) -> None:
        if self.out:
            self.out.flush()

    def provenance(self, record: dict[str, object]) -> None:
        if self.out:
            self.out.provenance(record)

    def note(self, text: str) -> None:
        if self.out:
            self.out.note(text)
        self.bar.write(f"note: {text}")

    def phase(self, name: str, **details: float) -> None:
        if self.out:
            self.out.phase(name, **details)
        if name == WARM_START:
            self.bar.set_description(
                f"warm start {details['step']}/{details['max_steps']} (first run only), "
                f"accuracy {details['accuracy']:.2f}"
            )
        else:
            self.bar.set_description(name if name != TRAINING else "")

    def close(self) -> None:
        self.bar.close()
        if self.out:
            self.out.close()


def _load(path: Path) -> run_config.RunConfig | None:
    """The run's config, or None with the error said on stderr."""
    try:
        return run_config.load(path)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def cmd_run(args: argparse.Namespace) -> int:
    cfg = _load(args.config)
    if cfg is None:
        return 2
    if cfg.execution.train_processes > 1:
        return _start_ranks(args, cfg.execution.train_processes)
    from rlcore import trainer

    return _train(args, cfg, trainer.train)


def _start_ranks(args: argparse.Namespace, processes: int) -> int:
    """torchrun with `processes` ranks of this run; its exit status (the first failing rank's)."""
    from rlcore import launch

    entry = launch.rlcore_rank(
        args.config, out=args.out, checkpoint_dir=args.checkpoint_dir, cache_dir=args.cache_dir
    )
    proc = launch.start_ranks(entry, processes)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        launch.stop_ranks(proc)
        return 130


def cmd_rank(args: argparse.Namespace) -> int:
    """One trainer rank under torchrun (started by `run`): rank 0 reports, the others train."""
    cfg = _load(args.config)
    if cfg is None:
        return 2
    from rlcore import distributed

    if int(os.environ.get("RANK", "0")) != 0:
        distributed.train(cfg, None, checkpoint_dir=args.checkpoint_dir, cache_dir=args.cache_dir)
        distributed.end_process(0)
    distributed.end_process(_train(args, cfg, distributed.train))


def _train(args: argparse.Namespace, cfg: run_config.RunConfig, train) -> int:
    from rlcore import trainer

    sink = ProgressSink(cfg.steps, JsonlSink(args.out) if args.out else None)
    started = time.perf_counter()
    try:
        summary = train(cfg, sink, checkpoint_dir=args.checkpoint_dir, cache_dir=args.cache_dir)
    # Bad datasets, model paths, devices or checkpoints surface as ValueError/OSError.
    except (trainer.Diverged, ValueError, OSError) as exc:
        sink.close()
        print(f"error: {exc}", file=sys.stderr)
        return 1
    sink.close()
    elapsed = time.perf_counter() - started
    print(
        f"{cfg.algorithm.preset} | {cfg.staleness.label} | seed {cfg.seed}: "
        f"{int(summary['steps'])} steps in {elapsed:.1f} s\n"
        f"  eval/accuracy {summary['eval/accuracy_initial']:.3f} -> {summary.get('eval/accuracy', float('nan')):.3f}\n"
        f"  reward/mean (last step) {summary.get('reward/mean', float('nan')):.3f}, "
        f"kl/init {summary.get('kl/init', float('nan')):.4f}"
    )
    if args.out:
        print(f"  metrics: {args.out}")
    return 0


def cmd_presets(_: argparse.Namespace) -> int:
    """The presets by family: each one's line, and the knobs its loss reads with their values."""
    for family, names in presets.families().items():
        print(family)
        for name in names:
            preset = presets.PRESETS[name]
            spec = preset.spec
            knobs = ", ".join(f"{k}={getattr(spec, k)}" for k in spec.knobs())
            print(f"  {name:22} {preset.description}")
            print(f"  {'':22} {knobs}")
    return 0


def cmd_schema(_: argparse.Namespace) -> int:
    print(json.dumps(run_config.RunConfig.model_json_schema(), indent=2))
    return 0


def cmd_build_tiny(args: argparse.Namespace) -> int:
    """Warm-start the default tiny model and write it where the package ships it (rlcore/tiny_models/)."""
    import shutil

    import torch

    from rlcore import models, tasks

    config = run_config.RunConfig()
    task = tasks.build(config.task)
    target = models.SHIPPED / f"tiny-{models.tiny_cache_key(config)}"
    if target.exists() and not args.force:
        print(f"error: {target} exists; --force rebuilds it", file=sys.stderr)
        return 1
    building = target.with_name(target.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    models.build_tiny(config, task, building)
    shutil.rmtree(target, ignore_errors=True)
    building.rename(target)
    lm = models.load_pretrained(str(target), "float32", torch.device("cpu"))
    accuracy = models.evaluate(lm, task, task.held_out, config.rollout.max_new_tokens).accuracy
    digest = models.weights_sha256(lm.model)
    (target / "theta0.sha256").write_text(digest + "\n")
    print(f"{target}: held-out accuracy {accuracy:.3f}, theta0_sha256 {digest}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlcore", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train one run config")
    run.add_argument("config", type=Path, help="run config, YAML or JSON")
    run.add_argument("--out", type=Path, help="write metrics and samples as JSONL here")
    run.add_argument("--checkpoint-dir", type=Path, help="checkpoint here and resume from it")
    run.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="built-in model cache")
    run.set_defaults(func=cmd_run)
    rank = sub.add_parser("rank", help=argparse.SUPPRESS)  # one rank under torchrun (`run` starts them)
    rank.add_argument("config", type=Path)
    rank.add_argument("--out", type=Path)
    rank.add_argument("--checkpoint-dir", type=Path)
    rank.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    rank.set_defaults(func=cmd_rank)
    sub.add_parser("presets", help="list the algorithm presets").set_defaults(func=cmd_presets)
    sub.add_parser("schema", help="print the RunConfig JSON schema").set_defaults(func=cmd_schema)
    build = sub.add_parser("build-tiny", help="warm-start the default tiny θ0 the package ships")
    build.add_argument("--force", action="store_true", help="rebuild it even if it exists")
    build.set_defaults(func=cmd_build_tiny)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
