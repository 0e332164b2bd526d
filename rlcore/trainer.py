"""The training loop: publish the weights → take the batch → advantage → loss → one optimiser step
→ metrics (docs/algorithms.md §7), for one `RunConfig`, with batches from a `BatchSource`
(`rlcore.sources`). All randomness comes from generators seeded by (seed, step, purpose): the same
config and seed give the same curve, and every preset sees the same prompts at the same step."""

from __future__ import annotations

import contextlib
import copy
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from rlcore import algorithms, checkpoints, models, provenance, sources, tasks
from rlcore.batch import Batch, seeded_rng
from rlcore.config import RunConfig
from rlcore.evaluate import Evaluator
from rlcore.produce import Producer, make_engine
from rlcore.ranks import Ranks, cuts
from rlcore.rollout import score_responses, token_logprobs
from rlcore.sinks import (
    BAPO_METRICS,
    CHECKPOINTING,
    EVALUATING,
    MISMATCH_METRICS,
    PREPARING,
    SUMMARY_LATEST,
    TRAINING,
    Sample,
    Sink,
    Stopped,
    ignore_phase,
    never_stop,
)


class Diverged(RuntimeError):
    """The loss or the gradient became NaN/inf; what was logged before stays."""


@dataclass
class Progress:
    """What the summary needs across a resume."""

    initial_eval: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    eval_step: int = -1  # the newest evaluation's step in `last`

    def restore(self, state: dict) -> None:
        self.initial_eval = dict(state["initial_eval"])
        self.last = dict(state["last"])
        self.eval_step = int(state["eval_step"])


def lr_factor(config: RunConfig, step: int) -> float:
    """Multiplier of the base lr for optimiser step `step` (0-based)."""
    opt = config.optimizer
    if step < opt.warmup_steps:
        return (step + 1) / opt.warmup_steps
    if opt.schedule == "constant":
        return 1.0
    progress = (step - opt.warmup_steps) / max(1, config.steps - opt.warmup_steps)
    if opt.schedule == "linear":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


@dataclass
class Learner:
    """The trainer's live state: the policy, frozen θ0, the loss, the optimiser."""

    config: RunConfig
    task: tasks.Task
    lm: models.LoadedModel
    initial: torch.nn.Module  # frozen θ0, for kl/init
    algorithm: algorithms.Algorithm
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler

    @property
    def policy(self) -> torch.nn.Module:
        return self.lm.model

    @property
    def evaluator(self) -> Evaluator:
        return Evaluator(self.config, self.lm, self.initial, self.task)


def prepare(
    config: RunConfig,
    cache_dir: Path | None = None,
    phase: Callable[..., None] = ignore_phase,
    should_stop: Callable[[], bool] = never_stop,
    *,
    device: torch.device | None = None,
    shard: Callable[[torch.nn.Module], None] | None = None,
) -> Learner:
    """Load θ0 (warm-starting the tiny model if it is not cached: `phase` hears how far, and
    `Stopped` ends it once `should_stop()` says so) and build the optimiser. `device`: where
    (default: what `config.device` resolves to); `shard`: applied to the policy after frozen θ0
    is copied from it and before the optimiser is built (`rlcore.distributed`: FSDP2)."""
    device = device if device is not None else models.resolve_device(config.device)
    task = tasks.build(config.task)
    lm = models.load(config, device, cache_dir, task, phase, should_stop)
    initial = copy.deepcopy(lm.model).eval().requires_grad_(False)
    if shard is not None:
        shard(lm.model)
    opt = config.optimizer
    optimizer = torch.optim.AdamW(
        lm.model.parameters(),
        lr=opt.lr,
        betas=(opt.beta1, opt.beta2),
        weight_decay=opt.weight_decay,
        fused=True,  # one kernel for all parameters, on CPU and CUDA alike
    )
    return Learner(
        config=config,
        task=task,
        lm=lm,
        initial=initial,
        algorithm=algorithms.build(config.algorithm.preset, **config.algorithm.params),
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(config, s)),
    )


def local_source(learner: Learner, cache_dir: Path | None = None) -> sources.LocalSource:
    """The exact simulated schedule in this process: a rollout engine holding a copy of θ0."""
    config = learner.config
    engine = make_engine(config, learner.lm, cache_dir, learner.task)
    # `auto` leaves θ0 to the update here: one process has no other side with time to spare.
    initial = learner.initial if config.execution.init_logprobs == "rollout" else None
    s = config.staleness
    return sources.LocalSource(
        Producer(config, learner.task, learner.lm, engine, initial),
        config.steps,
        s.sync_interval,
        s.sync_offset,
        s.offline,
    )


def run_step(
    learner: Learner, source: sources.BatchSource, step: int, ranks: Ranks | None = None
) -> tuple[Batch, dict[str, float]]:
    """Trainer step `step`: publish the weights (version step − 1), take the batch, one update
    (`train_step`, with this rank's share of it under `ranks`)."""
    started = time.perf_counter()
    source.publish(step - 1, learner.policy)
    batch = source.take(step)
    taken = time.perf_counter()
    # How long the batch sat ready before the trainer took it (rollouts running ahead).
    queue_s = max(0.0, time.time() - batch.ready_at)
    metrics = train_step(learner, batch, step, ranks)
    learner.scheduler.step()
    done = time.perf_counter()
    metrics["time/step_s"] = done - started
    metrics["time/rollout_s"] = batch.generate_s
    metrics["time/wait_s"] = taken - started
    metrics["time/update_s"] = done - taken
    metrics["time/queue_s"] = queue_s
    metrics["tokens_per_s"] = float(batch.rollout.response_mask.sum()) / metrics["time/step_s"]
    return batch, metrics


def train(
    config: RunConfig,
    sink: Sink,
    *,
    checkpoint_dir: Path | None = None,
    cache_dir: Path | None = None,
    source: sources.BatchSource | None = None,
    ledger: checkpoints.Ledger | None = None,
    keep_checkpoints: int = checkpoints.KEEP,
) -> dict[str, float]:
    """Run `config` to the end (or until `sink.should_stop()`); return a summary.

    Batches come from `source`, by default a `LocalSource` (the simulated schedule). Resumes
    from the newest checkpoint in `checkpoint_dir` whose bytes match their sha256 in `ledger`
    (default: `checkpoints.json` in that folder) and from which `source` can go on (`resume`);
    a resumed run logs the same metrics as an uninterrupted one. Keeps the newest
    `keep_checkpoints`. Raises `Diverged` on NaN/inf, `CheckpointError` when no checkpoint there
    can be trusted. Reports each phase it enters through `sink.phase`: preparing (with the warm
    start's own reports), then per step training, evaluating, checkpointing. A stop asked for
    during the tiny model's warm start ends it there, with nothing logged.
    """
    sink.phase(PREPARING)
    try:
        learner = prepare(config, cache_dir, sink.phase, sink.should_stop)
    except Stopped:
        return {"steps": 0.0, "completed": 0.0}
    sink.provenance(provenance.record(config, learner.initial, next(learner.policy.parameters()).device))
    source = source if source is not None else local_source(learner, cache_dir)
    progress = Progress()
    if checkpoint_dir is not None and ledger is None:
        ledger = checkpoints.FileLedger(checkpoint_dir)
    start = 1 + (resume(checkpoint_dir, ledger, learner, source, progress, sink) if checkpoint_dir else 0)
    source.resume(start - 1)
    if start == 1:
        sink.phase(EVALUATING, step=0)
        progress.initial_eval = learner.evaluator.evaluate(learner.policy, step=0)
        progress.last.update(progress.initial_eval)
        sink.log(0, progress.initial_eval)

    def save(step: int) -> None:
        save_checkpoint(checkpoint_dir, step, learner, source, progress, ledger, keep_checkpoints)

    return steps(learner, source, sink, progress, start, save if checkpoint_dir is not None else None)


def steps(
    learner: Learner,
    source: sources.BatchSource,
    sink: Sink,
    progress: Progress,
    start: int,
    save: Callable[[int], None] | None = None,
    ranks: Ranks | None = None,
) -> dict[str, float]:
    """Trainer steps `start` to the end (or until `sink.should_stop()`, heard by every rank alike
    under `ranks`), each logged with its evaluations and samples, `save(step)` at each checkpoint
    step; then the evaluations made elsewhere once they are all in. Returns the run's summary."""
    config = learner.config
    steps_done = start - 1
    deferred = False  # an evaluation of this attempt is made elsewhere
    for step in range(start, config.steps + 1):
        if sink.should_stop() if ranks is None else ranks.broadcast_flag(sink.should_stop()):
            break
        sink.phase(TRAINING, step=step, steps=config.steps)
        try:
            batch, metrics = run_step(learner, source, step, ranks)
        except Stopped:
            break
        if step == config.steps or (config.eval_every and step % config.eval_every == 0):
            sink.phase(EVALUATING, step=step)
            evaluated = source.evaluate(step, learner.policy, learner.evaluator)
            deferred = deferred or evaluated is None
            metrics.update(evaluated or {})
        sink.log(step, metrics)
        if config.samples_per_step:
            examples = zip(batch.problems, batch.completions, batch.rewards.tolist(), strict=True)
            sink.sample(
                step,
                [
                    Sample(prompt=p.prompt, completion=c, reward=r)
                    for p, c, r in list(examples)[: config.samples_per_step]
                ],
            )
        progress.last.update(metrics)
        log_evaluations(source.evaluations(wait=False), sink, progress)
        steps_done = step
        if save is not None and config.checkpoint_every and step % config.checkpoint_every == 0:
            sink.phase(CHECKPOINTING, step=step)
            sink.flush()  # a run resumed from this checkpoint must find every earlier point
            save(step)

    if steps_done == config.steps:
        # Evaluations made elsewhere (rollout workers) end the run once they are all in.
        if deferred:
            sink.phase(EVALUATING, step=steps_done)
        with contextlib.suppress(Stopped):  # cancelled meanwhile: what came back is logged
            log_evaluations(source.evaluations(wait=True), sink, progress)
    return {
        "steps": float(steps_done),
        "completed": float(steps_done == config.steps),
        "eval/accuracy_initial": progress.initial_eval.get("eval/accuracy", float("nan")),
        **{k: progress.last[k] for k in SUMMARY_LATEST if k in progress.last},
    }


def log_evaluations(done: list[tuple[int, dict[str, float]]], sink: Sink, progress: Progress) -> None:
    """Log evaluations that came back from elsewhere at their own step; the summary keeps the
    newest step's."""
    for step, metrics in sorted(done):
        sink.log(step, metrics)
        if step >= progress.eval_step:
            progress.eval_step = step
            progress.last.update(metrics)


def train_step(learner: Learner, batch: Batch, step: int, ranks: Ranks | None = None) -> dict[str, float]:
    """Advantages, loss, `optimizer.epochs` passes over `optimizer.minibatches` mini-batches of
    whole prompt groups, one optimiser step each (gradients accumulated over micro-batches),
    metrics. The proximal log-probs (the step-start weights' own, one no-grad forward) are taken
    first when the loss needs them (for `anchor: loglinear`, whose p follows π by each row's lag,
    only where M2PO's selection or BAPO's search needs that forward); entropy and kl/init are read
    from the first pass over the batch, the loss and the ratio diagnostics too (docs/algorithms.md
    §7, §14), once per step: over the whole batch after its updates, or, with one optimiser step
    on the batch in one forward, by that forward's loss itself; each group of scalars is read
    together (`algorithms.scalars`).

    With `ranks` (trainer processes, `rlcore.distributed`) every rank holds the whole batch and
    runs this on it alike: each forward and backward takes the rank's share of whole prompt
    groups (`Ranks.share`), the losses are normalised by the whole (mini-)batch's counts, and the
    log-probs and sums are put together across ranks before anything reads them, so whole-batch
    selections and every metric see the whole batch, as in one process."""
    config, algorithm, policy = learner.config, learner.algorithm, learner.policy
    device = next(policy.parameters()).device
    rollout = batch.rollout.to(device).trimmed()
    width = rollout.response_ids.shape[1]
    init_given = batch.init_logp  # θ0's log-probs, when they came with the batch
    if init_given is not None:
        init_given = init_given[:, :width].to(device)
    group_size = config.rollout.group_size
    advantages, keep = algorithm.advantages_and_keep(
        batch.rewards.to(device), group_size, seeded_rng(config.seed, step, "drop")
    )
    n = rollout.response_ids.shape[0]
    opt = config.optimizer
    micro = opt.micro_batch_size or n
    # Responses of one prompt share its forward pass when a micro-batch holds whole groups.
    shared = group_size if micro % group_size == 0 else 1
    mask = rollout.response_mask
    pass_ = _Pass(learner, rollout, init_given, shared, ranks)

    policy.eval()  # no dropout: the trainer's log-probs must match the rollout's
    # The step-start log-probs p take a forward of their own for M2PO's whole-batch selection, for
    # BAPO's search before the first backward, and once a step holds several optimiser steps; with
    # one, p is π itself wherever the gradient is taken (the same weights), detached. A loglinear
    # anchor takes none: its p is interpolated between μ and π by each row's lag (§6).
    several = opt.minibatches * opt.epochs > 1
    loglinear = algorithm.spec.anchor == "loglinear"
    row_lag = (step - 1 - batch.versions()).to(device)
    started = time.perf_counter()
    searched = algorithm.spec.surrogate in ("m2po", "bapo")
    prox = pass_.proximal(micro) if searched or (several and not loglinear) else None
    proximal_s = time.perf_counter() - started if prox is not None else 0.0
    selected = None if prox is None else algorithm.selection(prox, rollout.logp, mask, advantages, prox)
    order = seeded_rng(config.seed, step, "minibatches")
    updates = []  # (clip_frac, grad_norm) per optimiser step
    logp_first = torch.zeros_like(rollout.logp)
    last_proximal = None  # (rows, π) of the step's last mini-batch, which kl/proximal reads
    lr = learner.optimizer.param_groups[0]["lr"]
    # With one optimiser step on the whole batch in one forward, the update's loss is the one the
    # metrics read (the same log-probs, anchor and selection): its diagnostics are taken there and
    # the loss is not computed again. Not for BAPO, whose update searches from p, the metrics from π.
    pass_.metrics_in_update = (
        ranks is None and not several and micro >= n and algorithm.spec.surrogate != "bapo"
    )
    for epoch in range(opt.epochs):
        for rows in minibatch_rows(n // group_size, group_size, opt.minibatches, order, device):
            part = rollout.rows(rows)
            clip, logp = pass_.update(
                part,
                advantages[rows],
                None if prox is None else prox[rows],
                None if selected is None else selected[rows],
                init_given[rows] if init_given is not None and epoch == 0 else None,
                micro,
                first=epoch == 0,
                fresh=not updates,
                lag=row_lag[rows],
            )
            if epoch == 0:
                logp_first[rows] = logp
            grad_norm = clip_grad_norm(policy, opt.grad_clip, ranks)
            if not math.isfinite(grad_norm) or not bool(torch.isfinite(logp).all()):
                learner.optimizer.zero_grad(set_to_none=True)
                raise Diverged(f"diverged at step {step}: grad_norm={grad_norm}")
            learner.optimizer.step()
            updates.append((clip, grad_norm))
            if prox is not None or loglinear:
                last_proximal = (rows, logp)

    step_start = prox if prox is not None else logp_first  # one optimiser step: π at the step's start
    # The p the metrics compare μ with: under a loglinear anchor its own, at the first pass.
    proximal_p = algorithms.loglinear_anchor(logp_first, rollout.logp, row_lag) if loglinear else step_start
    if pass_.metrics_in_update:
        loss, stats = pass_.step_loss
    else:
        with torch.no_grad():
            loss, stats = algorithm.policy_loss(
                logp_first,
                rollout.logp,
                mask,
                advantages,
                logp_prox=step_start,
                selected=selected,
                max_length=config.rollout.max_new_tokens,
                by_mechanism=True,
                lag=row_lag,
            )
    if selected is not None:  # M2PO's second moment before and after its selection
        stats.update(algorithms.second_moments(prox, rollout.logp, mask, selected))
    if not math.isfinite(float(loss)):
        raise Diverged(f"diverged at step {step}: loss={float(loss)}")
    stats["clip_frac"] = sum(c for c, _ in updates) / len(updates)
    if pass_.searches:  # BAPO's bounds and balance, over the step's optimiser steps
        stats.update(zip(BAPO_METRICS, map(statistics.fmean, zip(*pass_.searches, strict=True)), strict=True))
    sums = pass_.totals()
    if ranks is not None:
        sums = ranks.sum_floats(sums)
    total_tokens = float(mask.sum().clamp(min=1))
    with torch.no_grad():
        read = step_scalars(
            batch, rollout, keep, row_lag, proximal_p, total_tokens, last_proximal, loglinear, prox
        )
    return {
        "reward/mean": read["reward/mean"],
        "reward/std": read["reward/std"],
        "accuracy": read["accuracy"],
        **{name: value / total_tokens for name, value in sums.items()},
        **stats,
        "kl/proximal": read.get("kl/proximal", 0.0),
        "kl/behavior_proximal": read["kl/behavior_proximal"],
        **mismatch(
            batch, rollout, prox if prox is not None else logp_first if len(updates) == 1 else None, step
        ),
        "staleness": float(step - 1 - batch.version),
        **{
            name: read[name] for name in ("staleness/mean", "staleness/p50", "staleness/p95", "staleness/max")
        },
        **staleness_split(batch, step),
        "policy_version": float(batch.version),
        "drop_frac": read["drop_frac"],
        "response_length/mean": read["response_length/mean"],
        "grad_norm": sum(g for _, g in updates) / len(updates),
        "loss": float(loss),
        "lr": lr,
        "optimizer_steps": float(len(updates)),
        "time/proximal_s": proximal_s,
    }


def step_scalars(
    batch: Batch,
    rollout,
    keep: torch.Tensor,
    row_lag: torch.Tensor,
    proximal_p: torch.Tensor,
    total_tokens: float,
    last_proximal: tuple[torch.Tensor, torch.Tensor] | None,
    loglinear: bool,
    prox: torch.Tensor | None,
) -> dict[str, float]:
    """The step's scalar metrics that are not the loss's, read together (`algorithms.scalars`: one
    synchronisation per accelerator device), without gradient: rewards, accuracy, kl/behavior_proximal, kl/proximal (on the step's
    last mini-batch, `last_proximal`: its rows and π; absent when the step has no p), the lag over
    the batch's sequences (one value unless async parts came from several versions), drop_frac and
    response_length/mean."""
    mask = rollout.response_mask
    rewards = batch.rewards
    lag = row_lag.float().cpu()
    quantiles = lag.quantile(torch.tensor([0.5, 0.95]))  # one sort for both
    named = {
        "reward/mean": rewards.mean(),
        "reward/std": rewards.std(correction=0),
        "accuracy": batch.correct.float().mean(),
        # k1 of the step-start weights p (a loglinear anchor's p) against μ, beside kl/behavior's π.
        "kl/behavior_proximal": ((rollout.logp - proximal_p) * mask).sum() / total_tokens,
        "staleness/mean": lag.mean(),
        "staleness/p50": quantiles[0],
        "staleness/p95": quantiles[1],
        "staleness/max": lag.max(),
        "drop_frac": 1 - keep.float().mean(),
        "response_length/mean": mask.sum(dim=1).mean(),
    }
    if last_proximal is not None:
        rows, logp = last_proximal
        m, logp_old = mask[rows], rollout.logp[rows]
        p = algorithms.loglinear_anchor(logp, logp_old, row_lag[rows]) if loglinear else prox[rows]
        named["kl/proximal"] = ((p - logp) * m).sum() / m.sum().clamp(min=1)
    return algorithms.scalars(named)


def minibatch_rows(
    groups: int, group_size: int, minibatches: int, generator: torch.Generator, device: torch.device
) -> list[torch.Tensor]:
    """The rows of each mini-batch: whole prompt groups, in a permutation drawn from `generator`
    (one mini-batch: the batch in its own order)."""
    order = torch.randperm(groups, generator=generator) if minibatches > 1 else torch.arange(groups)
    rows = (order[:, None] * group_size + torch.arange(group_size)[None, :]).flatten()
    return [
        chunk.to(device)
        for chunk in torch.tensor_split(rows, [g * group_size for g in cuts(groups, minibatches)])
    ]


def clip_grad_norm(policy: torch.nn.Module, max_norm: float, ranks: Ranks | None = None) -> float:
    """Clip the gradients' total norm to `max_norm`; return the norm before clipping (over every
    rank's shard when the policy is sharded: the shards' squared norms summed across `ranks` in
    one collective, then each rank scales its own shards as `clip_grad_norm_` would)."""
    grads = [p.grad for p in policy.parameters() if p.grad is not None]
    if ranks is None or not grads or not hasattr(grads[0], "to_local"):
        norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), max_norm)
        if hasattr(norm, "full_tensor"):  # a DTensor (FSDP2): the norm of the whole gradient
            norm = norm.full_tensor()
        return float(norm)
    local = [g.to_local() for g in grads]
    squares = torch.stack(torch._foreach_norm(local)).square().sum()
    norm = ranks.sum_tensor(squares).sqrt()
    torch._foreach_mul_(local, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return float(norm)


def staleness_split(batch: Batch, step: int) -> dict[str, float]:
    """An async batch's lag split (mean over rows): versions published while it was generated,
    and while it waited to be trained (the trainer holds version step − 1)."""
    if batch.ready_versions is None:
        return {}
    ready = batch.ready_versions.float()
    return {
        "staleness/in_flight": float((ready - batch.versions().float()).mean()),
        "staleness/in_queue": float((step - 1 - ready).mean()),
    }


def mismatch(batch: Batch, rollout, step_start: torch.Tensor | None, step: int) -> dict[str, float]:
    """mismatch/*: the rollout engine's log-probs μ against the same responses scored in the
    trainer's precision t (docs/algorithms.md §14): where the batch was made when it was re-scored
    there (`RunConfig.rescored`), else on the rows generated by the trainer's step-start weights
    (version step − 1), whose t is the step-start log-probs; nothing when there are none. Besides
    k1, k3 and the largest |t − μ|, the drift t − μ's token mean, signed and absolute."""
    m = rollout.response_mask
    if batch.rescored_logp is not None:
        t = batch.rescored_logp[:, : rollout.logp.shape[1]].to(rollout.logp.device)
    elif step_start is not None:
        t = step_start
        m = m * (batch.versions() == step - 1).to(m.device, m.dtype)[:, None]
    else:
        return {}
    if not bool(m.any()):
        return {}
    gap = (t - rollout.logp) * m
    count = m.sum()
    # k1, k3, abs_max, then the signed and absolute drift t − μ (docs/algorithms.md §7), in one sync.
    values = torch.stack(
        [
            (-gap).sum() / count,
            ((gap.exp() - 1 - gap) * m).sum() / count,
            gap.abs().max(),
            gap.sum() / count,
            gap.abs().sum() / count,
        ]
    )
    return dict(zip(MISMATCH_METRICS, values.tolist(), strict=True))


@dataclass
class _Pass:
    """The forward/backward passes of one trainer step, and the sums its metrics read; with
    `ranks`, this rank's share of them (`train_step`)."""

    learner: Learner
    rollout: object
    init_given: torch.Tensor | None
    shared: int
    ranks: Ranks | None = None
    # Per micro-batch of the first pass: its sums of SUMS over the valid tokens, read at the end.
    sums: list[torch.Tensor] = field(default_factory=list)
    searches: list[tuple[float, float, float]] = field(default_factory=list)  # BAPO's, per mini-batch
    # The update's loss is the one the step's metrics read (`train_step`): it takes every
    # diagnostic, and leaves (its loss, detached; its statistics) in `step_loss`.
    metrics_in_update: bool = False
    step_loss: tuple[torch.Tensor, dict[str, float]] | None = None

    SUMS = ("entropy", "kl/init", "kl/init_k1", "kl/init_k3")

    @property
    def temperature(self) -> float:
        return self.learner.config.rollout.temperature

    def _own(self, n: int, micro: int) -> tuple[slice, list[tuple[slice, bool]]]:
        """This rank's rows of `n` (whole prompt groups) and its micro-batches within them, as
        (rows, real): every rank makes as many forward passes as the rank with the most, a rank
        with fewer making passes that count for nothing (FSDP's collectives pair them up)."""
        if self.ranks is None:
            return slice(0, n), [(slice(lo, min(n, lo + micro)), True) for lo in range(0, n, micro)]
        group_size = self.learner.config.rollout.group_size
        own = self.ranks.share(n, group_size)
        mine = own.stop - own.start
        pieces = [(slice(lo, min(mine, lo + micro)), True) for lo in range(0, mine, micro)]
        passes = self.ranks.passes(n, group_size, micro)
        return own, pieces + [(slice(0, min(mine, micro)), False)] * (passes - len(pieces))

    def proximal(self, micro: int, rollout=None) -> torch.Tensor:
        """[N, T] log-probs of the batch (or of `rollout`, a mini-batch of it) under the weights
        now (at the step's start: p): one no-grad forward, in micro-batches."""
        policy, whole = self.learner.policy, self.rollout if rollout is None else rollout
        n = whole.response_ids.shape[0]
        own, pieces = self._own(n, micro)
        rollout = whole if self.ranks is None else whole.rows(own)
        parts = []
        with torch.no_grad():
            for rows, real in pieces:
                part = rollout.rows(rows)
                logits = score_responses(policy, part, self.shared)
                if real:
                    parts.append(token_logprobs(logits, part.response_ids, self.temperature)[0])
        mine = torch.cat(parts)
        return mine if self.ranks is None else self.ranks.assemble(mine, own, n)

    def update(
        self,
        part,
        advantages: torch.Tensor,
        prox: torch.Tensor | None,
        selected: torch.Tensor | None,
        init_given: torch.Tensor | None,
        micro: int,
        first: bool,
        fresh: bool = False,
        lag: torch.Tensor | None = None,
    ) -> tuple[float, torch.Tensor]:
        """The gradient of one mini-batch `part`, accumulated over micro-batches (the caller
        steps the optimiser); returns (its clip fraction, its log-probs). On the batch's first
        pass the entropy and KL-to-θ0 sums are added up too. `fresh`: no optimiser step has been
        taken yet this step (the weights are the step-start ones, whose log-probs `prox` holds).
        `lag`: each row's lag in versions, which a loglinear anchor reads."""
        config, algorithm, policy = self.learner.config, self.learner.algorithm, self.learner.policy
        n = part.response_ids.shape[0]
        mask = part.response_mask
        tokens = float(mask.sum().clamp(min=1))
        bounds = None
        if algorithm.spec.surrogate == "bapo":  # searched over the whole mini-batch before any backward
            now = prox if fresh else self.proximal(micro, part)
            bounds = algorithm.search(now, part.logp, mask, advantages, prox, lag)
            self.searches.append(bounds)
        own, pieces = self._own(n, micro)
        if self.ranks is not None:  # this rank's whole prompt groups of the mini-batch
            part, advantages = part.rows(own), advantages[own]
            prox = None if prox is None else prox[own]
            selected = None if selected is None else selected[own]
            init_given = None if init_given is None else init_given[own]
            lag = None if lag is None else lag[own]
        clipped = 0.0
        logp_parts = []
        self.learner.optimizer.zero_grad(set_to_none=True)
        for rows, real in pieces:
            piece = part.rows(rows)
            logp, logp_all = token_logprobs(
                score_responses(policy, piece, self.shared), piece.response_ids, self.temperature
            )
            if not real:
                (logp * 0.0).sum().backward()  # the pass other ranks make; it adds nothing
                continue
            loss, stats = algorithm.policy_loss(
                logp,
                piece.logp,
                piece.response_mask,
                advantages[rows],
                # Without a proximal pass (one optimiser step) p is this forward's own π.
                logp_prox=logp.detach() if prox is None else prox[rows],
                selected=None if selected is None else selected[rows],
                bounds=bounds,
                total_tokens=tokens,
                total_seqs=n,
                max_length=config.rollout.max_new_tokens,
                by_mechanism=self.metrics_in_update,
                lag=None if lag is None else lag[rows],
                diagnostics=self.metrics_in_update,
            )
            if self.metrics_in_update:
                self.step_loss = (loss.detach(), stats)
            loss.backward()
            clipped += stats["clip_frac"] * float(piece.response_mask.sum())
            logp_parts.append(logp.detach())
            if first:
                self._add_sums(
                    piece, logp.detach(), logp_all.detach(), None if init_given is None else init_given[rows]
                )
        if self.ranks is None:
            return clipped / tokens, torch.cat(logp_parts)
        self.ranks.backward_done(policy)
        logp, clipped = self.ranks.assemble(torch.cat(logp_parts), own, n, extra=clipped)
        return clipped / tokens, logp

    def _add_sums(
        self, piece, logp: torch.Tensor, logp_all: torch.Tensor, init_all: torch.Tensor | None
    ) -> None:
        """Entropy and KL-to-θ0 sums of one micro-batch (θ0's forward when its log-probs did not
        come with the batch), kept as a tensor: `totals` reads them all at once."""
        with torch.inference_mode():
            m = piece.response_mask
            probs = logp_all.exp()
            if init_all is None:
                logits = score_responses(self.learner.initial, piece, self.shared)
                init_all = torch.log_softmax(logits / self.temperature, dim=-1)
            init_logp = init_all.gather(-1, piece.response_ids[..., None]).squeeze(-1)
            delta = logp - init_logp
            sums = [
                (-(probs * logp_all).sum(-1) * m).sum(),
                ((probs * (logp_all - init_all)).sum(-1) * m).sum(),
                (delta * m).sum(),
                ((torch.exp(-delta) - 1 + delta) * m).sum(),
            ]
            self.sums.append(torch.stack(sums))

    def totals(self) -> dict[str, float]:
        """The first pass's `SUMS` over this rank's micro-batches, in one synchronisation: each
        micro-batch's sums added in order as Python floats."""
        totals = dict.fromkeys(self.SUMS, 0.0)
        if self.sums:
            for row in torch.stack(self.sums).tolist():
                for name, value in zip(self.SUMS, row, strict=True):
                    totals[name] += value
        return totals


# ----- checkpoints -----------------------------------------------------------------------------


def save_checkpoint(
    directory: Path,
    step: int,
    learner: Learner,
    source: sources.BatchSource,
    progress: Progress,
    ledger: checkpoints.Ledger,
    keep: int = checkpoints.KEEP,
) -> Path:
    """Write everything a resume needs (tensors and plain data only), its sha256 to `ledger`;
    keep the newest `keep` checkpoints."""
    state = {
        "step": step,
        "config": learner.config.model_dump_json(),
        "policy": learner.policy.state_dict(),
        "optimizer": learner.optimizer.state_dict(),
        "scheduler": learner.scheduler.state_dict(),
        "source": source.state(),
        "progress": asdict(progress),
    }
    return checkpoints.save(directory, step, state, ledger, keep)


def resume(
    directory: Path,
    ledger: checkpoints.Ledger,
    learner: Learner,
    source: sources.BatchSource,
    progress: Progress,
    sink: Sink,
) -> int:
    """Restore the newest checkpoint in `directory` that can be trusted and resumed from; return
    its step, or 0 when the run starts from the beginning (none there).

    A checkpoint whose bytes do not match its recorded sha256 is set aside (`checkpoints.reject`)
    and the one before it tried. One the source cannot go on from (a batch it needs can no longer
    be made) is passed over, and so, at worst, the run starts again from step 0: it is
    deterministic, so it logs the same curve. Raises `CheckpointError` when checkpoints were there
    and none of them could be trusted: the run fails saying so, and a retry starts from step 0.
    """
    found = checkpoints.existing(directory)
    rejected, passed = [], []
    for step, path in checkpoints.trusted(found, ledger, rejected):
        if why_not := source.resume_problem(step):
            passed.append(f"{path.name}: {why_not}")
            continue
        restore(path, learner, source, progress)
        if rejected or passed:
            sink.note(f"resumed from {path.name}, passing over {'; '.join(rejected + passed)}")
        return step
    if rejected and not passed:
        raise checkpoints.CheckpointError(
            f"no checkpoint can be trusted: {'; '.join(rejected)}. Set aside as {checkpoints.REJECTED_SUFFIX}; "
            "a retry starts the run from step 0"
        )
    if not found and (sharded := checkpoints.existing_sharded(directory)):
        raise checkpoints.CheckpointError(
            f"checkpoint {sharded[0][1].name} was written by several trainer processes and this attempt "
            "is one: resume it with the execution.train_processes that wrote it"
        )
    if found:
        sink.note(f"started again from step 0, passing over {'; '.join(rejected + passed)}")
    return 0


def restore(path: Path, learner: Learner, source: sources.BatchSource, progress: Progress) -> int:
    """Load a verified checkpoint into the learner, the batch source and `progress`; return its step."""
    state = checkpoints.load(path, next(learner.policy.parameters()).device)
    if state["config"] != learner.config.model_dump_json():
        raise checkpoints.CheckpointError(
            f"checkpoint {path.name} was written by a different run config; refusing to resume"
        )
    learner.policy.load_state_dict(state["policy"])
    learner.optimizer.load_state_dict(state["optimizer"])
    learner.scheduler.load_state_dict(state["scheduler"])
    source.load_state(state["source"])
    progress.restore(state["progress"])
    return int(state["step"])
