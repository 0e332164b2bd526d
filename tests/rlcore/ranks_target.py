"""What the tests of `rlcore.distributed` run under torchrun: one rank of a run, reporting to a
`ListSink` on rank 0 (stopping after `--stop-after` steps when given); rank 0 writes the points,
the summary and every rank's bytes of parameters + optimiser state to OUT as JSON."""

import argparse
import json
import os
from pathlib import Path

import torch.distributed as dist

from rlcore import config as run_config
from rlcore import distributed
from rlcore.sinks import ListSink


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--checkpoint-dir", type=Path)
    parser.add_argument("--cache-dir", type=Path)
    parser.add_argument("--stop-after", type=int)
    args = parser.parse_args()
    config = run_config.load(args.config)
    sink = ListSink(stop_after_step=args.stop_after)
    held: list[int] = []

    def measure(learner, ranks) -> None:
        every = [None] * ranks.world
        dist.all_gather_object(every, distributed.held_bytes(learner))
        held.extend(every)

    summary = distributed.train(
        config, sink, checkpoint_dir=args.checkpoint_dir, cache_dir=args.cache_dir, on_done=measure
    )
    if os.environ["RANK"] == "0":
        args.out.write_text(json.dumps({"points": sink.points, "summary": summary, "held": held}))


if __name__ == "__main__":
    main()
    distributed.end_process(0)
