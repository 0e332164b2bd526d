"""Batch production: task + tokenizer + rollout engine → the scored batch of a trainer step.

`Producer.batch(step, version)` generates with whatever weights the engine holds (the caller
has loaded version `version` into it), scores the responses and, where they fit, computes
frozen θ0's next-token log-probs over the batch's responses (what `kl/init` and its k1/k3
estimators need from θ0, as verl's reference worker does): that forward pass, about a
quarter of a trainer step, then runs wherever the batch is made, on a rollout worker in
distributed and async execution. It needs neither the optimiser nor the algorithm, so a
rollout worker runs it as well as the trainer's process.
`groups` selects a slice of the step's prompt groups: a step split across rollout jobs
produces, group for group, the same responses as one job producing it whole.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rlcore import models, tasks
from rlcore.batch import Batch, group_rngs, seeded_rng
from rlcore.config import RunConfig
from rlcore.rollout import HFEngine, RolloutEngine, VLLMEngine, score_responses

# θ0 log-probs go with a batch while they are at most this many floats (rows × response
# positions × vocabulary: 16 MiB); with a real vocabulary and long responses the trainer computes
# them itself, in chunks, as ALGORITHMS.md §7 asks.
INIT_LOGP_FLOATS = 2**22


@dataclass
class Producer:
    """(step, version) -> a scored `Batch`, generated with the engine's current weights."""

    config: RunConfig
    task: tasks.Task
    lm: models.LoadedModel  # the tokenizer and token ids; its weights are not the behaviour's
    engine: RolloutEngine
    initial: torch.nn.Module | None = None  # frozen θ0; None: batches carry no θ0 log-probs

    def batch(self, step: int, version: int, groups: range | None = None) -> Batch:
        started = time.perf_counter()
        cfg = self.config.rollout
        groups = groups if groups is not None else range(cfg.prompts_per_step)
        # All of the step's prompts are drawn, so a slice of groups sees the same prompts.
        prompts = self.task.sample(cfg.prompts_per_step, seeded_rng(self.config.seed, step, "prompts"))
        unique = [prompts[g] for g in groups]
        rollout = self.engine.generate(
            self.lm.encode([p.prompt for p in unique]),
            cfg.max_new_tokens,
            cfg.temperature,
            cfg.top_p,
            group_rngs(self.config.seed, step, "sampling", groups),
            group_size=cfg.group_size,
        )
        problems = [p for p in unique for _ in range(cfg.group_size)]
        completions = self.lm.decode_responses(rollout)
        scores = [
            self.task.score(p, c, bool(f))
            for p, c, f in zip(problems, completions, rollout.finished, strict=True)
        ]
        init_logp = self.init_logp(rollout)  # before generate_s is taken: it counts too
        return Batch(
            step=step,
            version=version,
            problems=problems,
            completions=completions,
            rewards=torch.tensor([s.reward for s in scores], dtype=torch.float32),
            correct=torch.tensor([s.correct for s in scores]),
            rollout=rollout,
            pad_id=self.lm.pad_id,
            generate_s=time.perf_counter() - started,
            ready_at=time.time(),
            init_logp=init_logp,
        )

    def init_logp(self, rollout) -> torch.Tensor | None:
        """θ0's tempered log-softmax [N, T', V] at the rollout's response positions (T' its
        longest response), or None when there is no θ0 here or it would not fit
        `INIT_LOGP_FLOATS`. Each prompt runs once for its group, as in the trainer's forward."""
        if self.initial is None:
            return None
        trimmed = rollout.trimmed()
        n, t = trimmed.response_ids.shape
        vocab = self.initial.get_output_embeddings().weight.shape[0]
        if n * t * vocab > INIT_LOGP_FLOATS:
            return None
        device = next(self.initial.parameters()).device
        with torch.inference_mode():
            logits = score_responses(self.initial, trimmed.to(device), self.config.rollout.group_size)
            return torch.log_softmax(logits / self.config.rollout.temperature, dim=-1).cpu().clone()


def make_engine(
    config: RunConfig, lm: models.LoadedModel, cache_dir: Path | None, task: tasks.Task
) -> RolloutEngine:
    """The rollout engine the config names, holding a copy of `lm`'s weights (θ0 at the start)."""
    if config.rollout.engine == "hf":
        return HFEngine(lm.model, lm.eos_id, lm.pad_id)
    path = (
        config.model.path
        if config.model.source == "local"
        else str(models.tiny_model_path(config, task, cache_dir))
    )
    model_config = lm.model.config
    tied = bool(getattr(model_config, "tie_word_embeddings", False))
    return VLLMEngine(
        path,
        config.model.dtype,
        lm.eos_id,
        lm.pad_id,
        config.seed,
        model_config.max_position_embeddings,
        tied,
    )
