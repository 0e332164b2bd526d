"""What the test of an evaluation split across ranks runs under torchrun: each rank prepares the
run's learner, makes its policy end the responses to the first half of the held-out problems at
once (EOS forced) and run those of the second half to `max_new_tokens` (EOS barred), then
evaluates it with `distributed.evaluate_split`: rank 0's share ends at the first token, rank 1's
at the last. Rank 0 writes the metrics and each rank's sampled tokens to OUT as JSON."""

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from rlcore import config as run_config
from rlcore import distributed, trainer

STEP = 1  # the evaluation's step (it seeds the samples)


def ends_by_half(learner: trainer.Learner) -> torch.utils.hooks.RemovableHandle:
    """Make `learner.policy` answer each prompt of the first half of the held-out problems with
    EOS at once and never end those of the second half before `max_new_tokens`."""
    evaluator = learner.evaluator
    problems = evaluator.task.eval_problems(evaluator.config.eval_size)
    early = {tuple(ids) for ids in evaluator.lm.encode([p.prompt for p in problems[: len(problems) // 2]])}
    eos = evaluator.lm.eos_id
    rows: list[bool] = []

    def hook(module, args, kwargs, output):
        ids = kwargs["input_ids"]
        if ids.shape[1] > 1:  # a prefill: the prompts of the rows that follow
            mask = kwargs["attention_mask"].bool()
            rows[:] = [tuple(row[keep].tolist()) in early for row, keep in zip(ids, mask, strict=True)]
        for row, ends in enumerate(rows):
            output.logits[row, :, eos] = 1e4 if ends else -1e4
        return output

    return learner.policy.register_forward_hook(hook, with_kwargs=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--cache-dir", type=Path)
    args = parser.parse_args()
    config = run_config.load(args.config)
    ranks, device, _ = distributed.init(config)
    for turn in (0, 1):  # rank 0 warm-starts the tiny model if it is not cached, then the others read it
        if (ranks.rank > 0) == turn:
            learner = trainer.prepare(config, args.cache_dir, device=device)  # whole, as the mirror is
        dist.barrier()
    ends_by_half(learner)
    evaluator, size = learner.evaluator, config.eval_size
    bounds = [0, *distributed.cuts(size, ranks.world), size]
    mine = evaluator.evaluate_part(learner.policy, STEP, bounds[ranks.rank], bounds[ranks.rank + 1])
    metrics = distributed.evaluate_split(ranks, evaluator, learner.policy, STEP)
    tokens = [None] * ranks.world
    dist.all_gather_object(tokens, mine.tokens)
    dist.barrier()
    if os.environ["RANK"] == "0":
        args.out.write_text(json.dumps({"metrics": metrics, "tokens": tokens}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    distributed.end_process(0)
