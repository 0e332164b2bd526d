"""Held-out evaluation: greedy accuracy and reward, and k3 to θ0 on fresh samples, of a whole
held-out set or of a part of it (`EvalSums` of parts add up to the whole's)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlcore import models, tasks
from rlcore.batch import group_rngs
from rlcore.config import RunConfig
from rlcore.rollout import decode, score_responses, token_logprobs


@dataclass(frozen=True)
class Evaluator:
    """What a run's held-out evaluation needs besides the policy: its config, tokenizer (`lm`),
    frozen θ0 (`initial`) and task."""

    config: RunConfig
    lm: models.LoadedModel
    initial: torch.nn.Module
    task: tasks.Task

    def evaluate(self, policy: torch.nn.Module, step: int) -> dict[str, float]:
        """The policy after step `step`'s update, on the whole held-out set."""
        return self.evaluate_part(policy, step, 0, self.config.eval_size).metrics()

    def evaluate_part(self, policy: torch.nn.Module, step: int, first: int, stop: int) -> EvalSums:
        """The policy on held-out problems [first, stop)."""
        problems = self.task.eval_problems(self.config.eval_size)[first:stop]
        return evaluate_part(self.config, self.lm, policy, self.initial, self.task, problems, step, first)


# θ0 logits scored at once in an evaluation (2^27 floats: 512 MiB): with a real vocabulary and
# long responses a chunk holds a few prompts, with the built-in model the whole held-out set.
EVAL_LOGITS = 2**27


@dataclass(frozen=True)
class EvalSums:
    """An evaluation of some of the held-out problems, as sums: parts evaluated apart (by
    rollout workers) add up to the evaluation of the whole set."""

    n: int = 0  # problems
    correct: float = 0.0
    reward: float = 0.0
    k3: float = 0.0  # Σ over sampled tokens of k3(θ ‖ θ0)
    tokens: float = 0.0

    def __add__(self, other: EvalSums) -> EvalSums:
        return EvalSums(
            self.n + other.n,
            self.correct + other.correct,
            self.reward + other.reward,
            self.k3 + other.k3,
            self.tokens + other.tokens,
        )

    def metrics(self) -> dict[str, float]:
        return {
            "eval/accuracy": self.correct / self.n,
            "eval/reward": self.reward / self.n,
            "eval/kl_init": self.k3 / max(self.tokens, 1.0),
        }


def evaluate_part(
    config: RunConfig,
    lm: models.LoadedModel,
    policy: torch.nn.Module,
    initial: torch.nn.Module,
    task: tasks.Task,
    problems: list[tasks.Problem],
    step: int,
    first: int = 0,
) -> EvalSums:
    """`policy` evaluated on `problems`, held-out problems `first`, `first` + 1, …: greedy
    accuracy and reward, and k3 to θ0 (`initial`, with `lm`'s tokenizer) on fresh samples.

    Goes through the problems in chunks sized for memory (`models.EVAL_ROWS` prompts, at most
    `EVAL_LOGITS` θ0 logits); held-out problem i samples with its own generator, so neither the
    chunking nor the split into parts changes a sample."""
    greedy = models.evaluate(lm, task, problems, config.rollout.max_new_tokens, policy)
    prompts = lm.encode([p.prompt for p in problems])
    generators = group_rngs(config.seed, step, "eval", range(first, first + len(problems)))
    width = max(len(ids) for ids in prompts) + config.rollout.max_new_tokens
    vocab = policy.get_output_embeddings().weight.shape[0]
    rows = max(1, min(models.EVAL_ROWS, EVAL_LOGITS // (width * vocab)))
    device = next(initial.parameters()).device
    k3_sum, tokens = 0.0, 0.0
    with torch.inference_mode():
        for lo in range(0, len(problems), rows):
            sampled = decode(
                policy,
                prompts[lo : lo + rows],
                config.rollout.max_new_tokens,
                config.rollout.temperature,
                config.rollout.top_p,
                generators[lo : lo + rows],
                lm.eos_id,
                lm.pad_id,
            ).to(device)
            init_logp, _ = token_logprobs(
                score_responses(initial, sampled), sampled.response_ids, config.rollout.temperature
            )
            delta = sampled.logp - init_logp
            m = sampled.response_mask
            k3_sum += float(((torch.exp(-delta) - 1 + delta) * m).sum())
            tokens += float(m.sum())
    return EvalSums(greedy.n, greedy.correct, greedy.reward_sum, k3_sum, tokens)
