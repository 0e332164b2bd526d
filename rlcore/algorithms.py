"""The loss family (docs/algorithms.md §2–5, §13, §16) as pure tensor functions: `build(name, **params)` gives
an `Algorithm` whose `advantages` are group-relative (with RED-Drop) and whose `policy_loss` has the
spec's gradient with respect to `logp`. Shapes: N responses, T response positions.

`policy_loss` is one head (`Ratios`), a surrogate picked by name from `SURROGATES`, and one tail
(behaviour correction, regulariser, OPSM, aggregation), each part picked by name from its table:
a new surrogate is one registered function, its name in `presets.Surrogate`, the knobs it reads in
`presets.READS`, and a preset."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import torch
from torch import Tensor

from rlcore.presets import AlgorithmSpec, preset_names, resolve
from rlcore.sinks import BAPO_METRICS, M2PO_METRICS, MASKED_METRICS

STD_EPS = 1e-6
# Probabilities in the binary KL are clamped to [ε, 1 − ε] (AReaL's).
PROB_EPS = 1e-8


def presets() -> list[str]:
    return preset_names()


def build(name: str, **params: object) -> Algorithm:
    """The preset `name` with parameter overrides; ValueError names a bad preset or parameter."""
    return Algorithm(name=name, spec=resolve(name, params))


def red_drop_keep(rewards: Tensor, group_size: int, generator: torch.Generator | None = None) -> Tensor:
    """RED-Drop (§5): per group, drop #neg − #pos random negatives. Returns kept: bool[N]."""
    groups = rewards.view(-1, group_size)
    keep = torch.ones_like(groups, dtype=torch.bool)
    positive = groups >= groups.mean(dim=1, keepdim=True)
    for g in range(groups.shape[0]):
        negatives = torch.nonzero(~positive[g]).flatten()
        excess = negatives.numel() - int(positive[g].sum())
        if excess > 0:
            order = torch.randperm(negatives.numel(), generator=generator)
            keep[g, negatives[order[:excess]]] = False
    return keep.flatten()


def group_advantages(
    rewards: Tensor, group_size: int, keep: Tensor, std_normalize: bool, std: str = "sample"
) -> Tensor:
    """A_i = r_i − mean (÷ (σ + 1e-6) if normalising) over the kept responses of its group (§2).

    Dropped responses get A = 0. A group with a single kept response uses mean 0, std 1.
    """
    r = rewards.view(-1, group_size).to(torch.float64)
    kept = keep.view(-1, group_size).to(torch.float64)
    n = kept.sum(dim=1, keepdim=True)
    mean = (r * kept).sum(dim=1, keepdim=True) / n.clamp(min=1)
    mean = torch.where(n > 1, mean, torch.zeros_like(mean))
    centred = (r - mean) * kept
    if std_normalize:
        dof = n - 1 if std == "sample" else n
        sigma = ((centred**2).sum(dim=1, keepdim=True) / dof.clamp(min=1)).sqrt()
        sigma = torch.where(n > 1, sigma, torch.ones_like(sigma))
        centred = centred / (sigma + STD_EPS)
    return centred.flatten().to(rewards.dtype)


def loglinear_weight(lag: Tensor) -> Tensor:
    """A-3PO's interpolation weight (docs/algorithms.md §14) for a lag of d versions: α = (d − 1)/d,
    clamped to [0, 1], for d > 0; 0 for d ≤ 0. So d = 0 and d = 1 give α = 0 (p = μ)."""
    d = lag.to(torch.float64)
    positive = d > 0
    alpha = ((d - 1) / torch.where(positive, d, torch.ones_like(d))).clamp(0, 1)
    return torch.where(positive, alpha, torch.zeros_like(alpha))


def loglinear_anchor(logp: Tensor, logp_old: Tensor, lag: Tensor) -> Tensor:
    """A-3PO's proximal log-probs without a proximal forward (AReaL `prox_logp_method: loglinear`):
    p = μ + α·(sg(π) − μ), α = `loglinear_weight(lag)`; `lag` [N] per response (or [N, T] per
    token), π = `logp` [N, T] as this forward has it, so p follows π and carries no gradient."""
    alpha = loglinear_weight(lag).to(device=logp.device, dtype=logp.dtype)
    if alpha.dim() == 1:
        alpha = alpha[:, None]
    return logp_old + alpha * (logp.detach() - logp_old)


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


@dataclass(frozen=True)
class Algorithm:
    name: str
    spec: AlgorithmSpec

    def advantages(
        self, rewards: Tensor, group_size: int, generator: torch.Generator | None = None
    ) -> Tensor:
        """Tensor[N] of advantages; rewards are consecutive groups of `group_size`."""
        return self.advantages_and_keep(rewards, group_size, generator)[0]

    def advantages_and_keep(
        self, rewards: Tensor, group_size: int, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """(advantages[N], kept[N] bool): `kept` is False for responses RED-Drop removed."""
        if rewards.numel() % group_size:
            raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
        if self.spec.red_drop:
            keep = red_drop_keep(rewards, group_size, generator)
        else:
            keep = torch.ones_like(rewards, dtype=torch.bool)
        adv = group_advantages(rewards, group_size, keep, self.spec.std_normalize, self.spec.std)
        return adv, keep

    def needs_proximal(self) -> bool:
        """Whether the loss needs the trainer's own step-start log-probs (p): a proximal anchor,
        or M2PO's whole-batch selection."""
        return (self.spec.anchor == "proximal" and self.spec.reads_ratio) or self.spec.surrogate == "m2po"

    def anchor_logp(
        self,
        logp_old: Tensor,
        logp_prox: Tensor | None,
        logp: Tensor | None = None,
        lag: Tensor | None = None,
    ) -> Tensor:
        """The log-probs the ratio is taken against: μ (behaviour), p (proximal), or under
        `loglinear` p interpolated between μ and this forward's π (`logp`) by the data's `lag`
        (`loglinear_anchor`; `logp_prox` is not read); μ for a loss that reads no ratio."""
        if self.spec.anchor == "behaviour" or not self.spec.reads_ratio:
            return logp_old
        if self.spec.anchor == "loglinear":
            if lag is None or logp is None:
                raise ValueError(f"{self.name} is anchored loglinear: pass each response's lag")
            return loglinear_anchor(logp, logp_old, lag)
        if logp_prox is None:
            raise ValueError(f"{self.name} is anchored on the proximal log-probs: pass logp_prox")
        return logp_prox

    def selection(
        self,
        logp_start: Tensor,
        logp_old: Tensor,
        mask: Tensor,
        advantages: Tensor,
        logp_prox: Tensor | None = None,
    ) -> Tensor | None:
        """M2PO's token mask [N, T] (1 kept), chosen once over the whole batch from the step-start
        log-probs against the behaviour's, (p − μ)² as AReaL masks, whatever the anchor the loss's
        ratio takes (`logp_prox` is not read); None for every other surrogate. Largest first, until
        the mean over the valid tokens left is ≤ τ (with `m2po_quadrants`: only tokens whose ratio
        moved with their advantage may go, and selection also stops when none is left). Ties go in
        row order."""
        s = self.spec
        if s.surrogate != "m2po":
            return None
        valid = mask.flatten() > 0
        log_ratio = (logp_start.detach() - logp_old).flatten()
        m2 = log_ratio.to(torch.float64) ** 2
        eligible = valid.clone()
        if s.m2po_quadrants:
            adv = self._effective(advantages, logp_start.detach(), logp_old, mask)[:, None].expand_as(mask)
            adv = adv.flatten()
            eligible &= ((adv > 0) & (log_ratio > 0)) | ((adv < 0) & (log_ratio < 0))
        candidates = torch.nonzero(eligible).flatten()
        order = candidates[torch.argsort(m2[candidates], descending=True, stable=True)]
        n_valid = int(valid.sum())
        total = float(m2[valid].sum())
        # Mean over the valid tokens left after masking the first k candidates, for k = 0..len.
        removed = torch.cat([torch.zeros(1, dtype=torch.float64), m2[order].cumsum(0)])
        left = n_valid - torch.arange(order.numel() + 1, dtype=torch.float64)
        mean_left = torch.where(left > 0, (total - removed) / left.clamp(min=1), torch.zeros_like(removed))
        fits = torch.nonzero(mean_left <= s.m2po_tau + 1e-12).flatten()
        k = int(fits[0]) if fits.numel() else order.numel()
        keep = torch.ones_like(m2, dtype=torch.bool)
        keep[order[:k]] = False
        return keep.view_as(mask).to(mask.dtype)

    def _effective(self, advantages: Tensor, logp: Tensor, logp_old: Tensor, m: Tensor) -> Tensor:
        """The advantages the loss uses: OPSM sets A = 0 on a response with A < 0 whose mean
        (μ − π) over its tokens exceeds δ (the response leaves the loss, its tokens stay counted)."""
        adv = advantages.detach().to(logp.dtype)
        delta = self.spec.opsm_delta
        if delta is None:
            return adv
        m = m.to(logp.dtype)
        drift = ((logp_old - logp.detach()) * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)
        return torch.where((adv < 0) & (drift > delta), torch.zeros_like(adv), adv)

    def policy_loss(
        self,
        logp: Tensor,
        logp_old: Tensor,
        mask: Tensor,
        advantages: Tensor,
        *,
        logp_prox: Tensor | None = None,
        selected: Tensor | None = None,
        bounds: tuple[float, float, float] | None = None,
        total_tokens: float | None = None,
        total_seqs: int | None = None,
        max_length: int | None = None,
        by_mechanism: bool = False,
        lag: Tensor | None = None,
        diagnostics: bool = True,
    ) -> tuple[Tensor, dict[str, float]]:
        """Scalar loss whose gradient w.r.t. `logp` [N, T] is the preset's, plus statistics.

        `logp_old` [N, T] are the behaviour log-probs μ recorded at rollout; `logp_prox` [N, T]
        the trainer's own log-probs under the step-start weights (needed when anchored on them);
        `mask` [N, T] is 1 on response tokens; `advantages` [N]. `selected` is M2PO's whole-batch
        mask (`selection`); without it M2PO selects over the rows given. `bounds` is BAPO's
        (c_low, c_high, s) searched over the whole mini-batch (`search`); without it BAPO searches
        over the rows given. For gradient
        accumulation over micro-batches, pass the whole (mini-)batch's `total_tokens` /
        `total_seqs` so that the sum of micro-batch losses equals its loss. `max_length` is the
        constant that `seq-mean-token-sum-norm` divides by (default: T). `by_mechanism`: the
        statistics also count the valid tokens each mechanism acted on (`MASKED_METRICS`, §7).
        `lag` [N]: each response's lag in versions (§6: the trainer's step-start version minus the
        one that generated it), which `anchor: loglinear` reads (`loglinear_anchor`).
        `diagnostics`: False leaves out every statistic but `clip_frac` (and BAPO's bounds): for a
        micro-batch's loss, whose step takes its diagnostics once, over the whole batch.
        """
        s = self.spec
        head = self.ratios(logp, logp_old, mask, advantages, logp_prox, selected, bounds, lag)
        # The surrogate, by name.
        token = _pick(SURROGATES, "surrogate", s.surrogate)(s, head)
        clipped = token.clipped if token.clipped is not None else torch.zeros_like(head.ratio)
        removed = (
            token.removed if token.removed is not None else torch.zeros_like(head.ratio, dtype=torch.bool)
        )

        # The tail every surrogate shares.
        q = (head.anchor - logp_old).exp()  # the behaviour weight π_prox/μ; 1 under a behaviour anchor
        q_weight, q_removed = _pick(CORRECTIONS, "correction", s.correction)(s, q, head)
        per_token = q_weight * token.per_token
        weight = token.weight * q_weight
        removed = removed | q_removed
        per_token = _pick(REGULARISERS, "reg", s.reg)(s, head, per_token)
        dropped = None
        if s.opsm_delta is not None:
            dropped = (head.adv == 0) & (advantages.detach().to(logp.dtype)[:, None] != 0)
            per_token = torch.where(dropped, torch.zeros_like(per_token), per_token)
            removed = removed | dropped

        n_seqs = total_seqs if total_seqs is not None else per_token.shape[0]
        aggregate = _pick(AGGREGATIONS, "loss_agg", s.loss_agg)
        loss = aggregate(per_token * head.m, head.m, n_seqs, total_tokens, max_length)
        with torch.no_grad():
            if not diagnostics:
                stats = {"clip_frac": float(_masked_mean(clipped, head.m))}
            else:
                counts = masked_counts(head.m, token, q_removed, dropped, clipped) if by_mechanism else None
                stats = self.statistics(
                    logp.detach(), logp_old, head.m, clipped.detach(), removed, weight.detach(), counts
                )
        if head.bounds is not None:
            stats.update(zip(BAPO_METRICS, head.bounds, strict=True))
        return loss, stats

    def ratios(
        self,
        logp: Tensor,
        logp_old: Tensor,
        mask: Tensor,
        advantages: Tensor,
        logp_prox: Tensor | None = None,
        selected: Tensor | None = None,
        bounds: tuple[float, float, float] | None = None,
        lag: Tensor | None = None,
    ) -> Ratios:
        """What every surrogate reads, computed once (the arguments are `policy_loss`'s)."""
        m = mask.to(logp.dtype)
        anchor = self.anchor_logp(logp_old, logp_prox, logp, lag)
        log_ratio = logp.detach() - anchor
        if selected is None:
            selected = self.selection(logp, logp_old, mask, advantages, logp_prox)
        adv = self._effective(advantages, logp, logp_old, m)[:, None]
        ratio = log_ratio.exp()
        if bounds is None and self.spec.surrogate == "bapo":
            bounds = self.search_bounds(self.search_sums(ratio, adv, m))
        return Ratios(
            logp=logp,
            anchor=anchor,
            behaviour=logp_old,
            m=m,
            adv=adv,
            ratio=ratio,
            seq_ratio=((log_ratio * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)).exp()[:, None],
            live=(logp - anchor).exp(),
            selected=selected,
            bounds=bounds,
        )

    def search(
        self,
        logp: Tensor,
        logp_old: Tensor,
        mask: Tensor,
        advantages: Tensor,
        logp_prox: Tensor | None = None,
        lag: Tensor | None = None,
    ) -> tuple[float, float, float] | None:
        """BAPO's clip bounds (c_low, c_high) and the balance s they reach, searched over the rows
        given (a whole mini-batch, before any backward, so that accumulation over micro-batches is
        exact) from the current log-probs `logp` (detached); None for every other surrogate."""
        if self.spec.surrogate != "bapo":
            return None
        return self.ratios(logp.detach(), logp_old, mask, advantages, logp_prox, lag=lag).bounds

    def bapo_grid(self) -> tuple[list[float], list[float]]:
        """The values BAPO's search tries in turn for c_low and for c_high: each from its start,
        raised by its step and capped at its end (the authors' loop)."""
        s = self.spec
        grids = []
        for start, end, step in (
            (s.bapo_low_start, s.bapo_low_end, s.bapo_low_step),
            (s.bapo_high_start, s.bapo_high_end, s.bapo_high_step),
        ):
            values = [start]
            while values[-1] < end:
                values.append(min(values[-1] + step, end))
            grids.append(values)
        return grids[0], grids[1]

    def search_sums(self, ratio: Tensor, adv: Tensor, m: Tensor) -> list[float]:
        """What BAPO's search reads of a batch, as sums (so that parts of it add up): per c_high
        tried, Σ_{A≥0} min(ρ, c_high)·A; per c_low tried, Σ_{A<0} max(ρ, c_low)·|A|, over valid
        tokens; and the count of valid tokens with A < 0."""
        lows, highs = self.bapo_grid()
        rho, a = ratio.detach().to(torch.float64), adv.expand_as(ratio).to(torch.float64)
        valid = m > 0
        pos, neg = valid & (a >= 0), valid & (a < 0)
        rho_pos, a_pos, rho_neg, a_neg = rho[pos], a[pos], rho[neg], -a[neg]
        sums = [(rho_pos.clamp(max=c) * a_pos).sum() for c in highs]
        sums += [(rho_neg.clamp(min=c) * a_neg).sum() for c in lows]
        sums.append(neg.sum().to(torch.float64))
        return torch.stack(sums).tolist()

    def search_bounds(self, sums: list[float]) -> tuple[float, float, float]:
        """BAPO's search on `search_sums`: s(c_low, c_high) = positive / (negative + 1e-8) (∞ without
        negative tokens); from (start, start), raise c_low while s < ρ₀ and c_low is below its end,
        then c_high likewise. Returns (c_low, c_high, s)."""
        lows, highs = self.bapo_grid()
        pos, neg, negatives = sums[: len(highs)], sums[len(highs) : -1], sums[-1]

        def balance(i: int, j: int) -> float:
            return pos[j] / (neg[i] + 1e-8) if negatives > 0 else math.inf

        target = self.spec.bapo_target
        i = j = 0
        while balance(i, j) < target and i + 1 < len(lows):
            i += 1
        while balance(i, j) < target and j + 1 < len(highs):
            j += 1
        return lows[i], highs[j], balance(i, j)

    @staticmethod
    def statistics(
        logp: Tensor,
        logp_old: Tensor,
        m: Tensor,
        clipped: Tensor,
        removed: Tensor,
        weight: Tensor,
        counts: Tensor | None = None,
    ) -> dict[str, float]:
        """Per-step diagnostics (§7, §14) over the valid tokens: the behaviour ratio ρ = e^{π−μ}'s
        quantiles and effective sample size, the share a clip acted on, the share a mask removed,
        the mean importance weight the loss applied to the tokens it kept, and with `counts`
        (`masked_counts`) the valid tokens each mechanism acted on (`MASKED_METRICS`), all read
        together (`scalars`)."""
        valid = m > 0
        log_ratio = logp - logp_old
        ratio = log_ratio.exp()
        values = ratio[valid].to(torch.float64)
        if values.numel() == 0:
            values = torch.ones(1, dtype=torch.float64)
        quantiles = torch.quantile(values, torch.tensor([0.01, 0.5, 0.99], dtype=torch.float64))
        kept = valid & ~removed.expand_as(valid)
        kept_weight = weight[kept]
        named = {
            "clip_frac": _masked_mean(clipped, m),
            "is_ratio/mean": values.mean(),
            "is_ratio/min": values.min(),
            "is_ratio/p01": quantiles[0],
            "is_ratio/p50": quantiles[1],
            "is_ratio/p99": quantiles[2],
            "is_ratio/max": values.max(),
            "ess_frac": values.sum() ** 2 / (values.numel() * (values**2).sum()),
            "correction/masked_frac": _masked_mean(removed.expand_as(m).to(m.dtype), m),
            # 1 where the loss kept no token (the mean of nothing).
            "correction/weight_mean": kept_weight.mean()
            if kept_weight.numel()
            else torch.ones((), device=m.device),
            "kl/behavior": _masked_mean(-log_ratio, m),
            "kl/behavior_k3": _masked_mean(ratio - 1 - log_ratio, m),
        }
        if counts is not None:
            named.update(zip(MASKED_METRICS, counts, strict=True))
        return scalars(named)


def scalars(named: dict[str, Tensor]) -> dict[str, float]:
    """0-d tensors as floats, exactly as `float` reads each: on an accelerator all of a device's in
    one synchronisation (stacked in float64, to which every dtype here widens without rounding); on
    the CPU, where reading a value waits for nothing, each on its own (cheaper than stacking)."""
    out: dict[str, float] = {}
    by_device: dict[torch.device, list[str]] = {}
    for name, value in named.items():
        if value.device.type == "cpu":
            out[name] = float(value)
        else:
            by_device.setdefault(value.device, []).append(name)
    for names in by_device.values():
        values = torch.stack([named[name].detach().to(torch.float64) for name in names]).tolist()
        out.update(zip(names, values, strict=True))
    return {name: out[name] for name in named}


def masked_counts(
    m: Tensor, token: TokenLoss, q_removed: Tensor, dropped: Tensor | None, clipped: Tensor
) -> Tensor:
    """`MASKED_METRICS` (§7) as a tensor [4]: how many valid tokens each mechanism acted on, each
    counted on its own (a token two of them hit counts in both): the staleness mask (the
    surrogate's token mask: M2PO, DPPO), the mismatch mask (the behaviour correction's on q: MIS,
    IcePop, KPop, decoupled-PPO's cap), the sequence mask (whole responses: TRM, OPSM) and the
    clip. `Algorithm.statistics` reads them with its other values."""
    valid = m > 0
    nothing = torch.zeros_like(valid)
    surrogate = nothing if token.removed is None else token.removed.expand_as(valid)
    sequence = surrogate if token.rows else nothing
    if dropped is not None:
        sequence = sequence | dropped.expand_as(valid)
    return torch.stack(
        [
            (valid & (nothing if token.rows else surrogate)).sum(),
            (valid & q_removed.expand_as(valid)).sum(),
            (valid & sequence).sum(),
            (valid & (clipped > 0).expand_as(valid)).sum(),
        ]
    )


def second_moments(logp_start: Tensor, logp_old: Tensor, mask: Tensor, selected: Tensor) -> dict[str, float]:
    """`M2PO_METRICS` (§7): M2PO's second moment, the mean of (p − μ)² over the valid tokens
    before its selection and over those it kept (0 when it kept none), as `selection` reads it."""
    valid = mask > 0
    m2 = (logp_start.detach() - logp_old).to(torch.float64) ** 2
    kept = valid & (selected > 0)
    sums = torch.stack([m2[valid].sum(), valid.sum(), m2[kept].sum(), kept.sum()]).tolist()
    return dict(zip(M2PO_METRICS, (sums[0] / max(sums[1], 1.0), sums[2] / max(sums[3], 1.0)), strict=True))


@dataclass(frozen=True)
class Ratios:
    """The head of the loss, shared by every surrogate ([N, T] unless said): `logp` π with its
    gradient, `anchor` the log-probs the ratio is taken against, `m` the mask in π's dtype, `adv`
    [N, 1] the advantages the loss uses (detached, after OPSM), `ratio` π/anchor detached,
    `seq_ratio` [N, 1] the geometric mean of a response's ratios, detached, `live` π/anchor with
    its gradient, `selected` M2PO's whole-batch mask (None for every other surrogate), `behaviour`
    μ, and `bounds` BAPO's searched (c_low, c_high, s) (None for every other surrogate)."""

    logp: Tensor
    anchor: Tensor
    behaviour: Tensor
    m: Tensor
    adv: Tensor
    ratio: Tensor
    seq_ratio: Tensor
    live: Tensor
    selected: Tensor | None
    bounds: tuple[float, float, float] | None = None


class TokenLoss(NamedTuple):
    """A surrogate's answer, [N, T]: the loss per token, where a clip acted (None: nowhere), the
    importance weight its gradient carries, and the tokens a mask took out of the loss (None:
    none), whole responses at a time where `rows`."""

    per_token: Tensor
    clipped: Tensor | None
    weight: Tensor
    removed: Tensor | None = None
    rows: bool = False  # `removed` takes whole responses out (a sequence mask), not single tokens


Fn = TypeVar("Fn", bound=Callable)


def _pick(table: dict[str, Fn], kind: str, name: str) -> Fn:
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}")
    return table[name]


# The surrogates (presets.Surrogate) by name, each (spec, ratios) -> TokenLoss; the head
# (`Algorithm.ratios`) and the tail (behaviour correction, regulariser, OPSM, aggregation) are
# `policy_loss`'s, written once for all of them.
SURROGATES: dict[str, Callable[[AlgorithmSpec, Ratios], TokenLoss]] = {}


def surrogate(name: str) -> Callable[[Fn], Fn]:
    def register(fn: Fn) -> Fn:
        SURROGATES[name] = fn
        return fn

    return register


@surrogate("rec")
def _rec(s: AlgorithmSpec, r: Ratios) -> TokenLoss:
    """REC: −A·w·π on the tokens its clip keeps; a clipped token gets no gradient, so no weight."""
    keep = _pick(CLIPS, "clip", s.clip)(s, r).to(r.ratio.dtype)
    weight = _pick(WEIGHTS, "weight", s.weight)(s, r)
    return TokenLoss(-r.adv * weight * r.logp * keep, 1 - keep, weight * keep)


def _ppo_clip(
    s: AlgorithmSpec, r: Ratios, live: Tensor, bounds: tuple[float, float] | None = None, dual: bool = True
) -> TokenLoss:
    """max(−A·ρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high)) on the ratio `live` (or clip(ρ, *bounds)),
    with the dual clip where `dual`."""
    low, high = bounds if bounds is not None else (1 - s.eps_low, 1 + s.eps_high)
    unclipped = -r.adv * live
    clipped_branch = -r.adv * live.clamp(low, high)
    per_token = torch.maximum(unclipped, clipped_branch)
    clipped = (clipped_branch > unclipped).to(r.logp.dtype)
    weight = live.detach() * (1 - clipped)
    if dual and s.dual_clip is not None:
        cap = -r.adv * s.dual_clip
        dual = (r.adv < 0) & (per_token > cap)
        per_token = torch.where(dual, cap.expand_as(per_token), per_token)
        clipped = torch.maximum(clipped, dual.to(r.logp.dtype))
    return TokenLoss(per_token, clipped, weight)


@surrogate("ppo")
def _ppo(s: AlgorithmSpec, r: Ratios) -> TokenLoss:
    return _ppo_clip(s, r, r.live)


@surrogate("gspo")
def _gspo(s: AlgorithmSpec, r: Ratios) -> TokenLoss:
    """PPO-clip on the sequence ratio s_i: value sg(s_i), gradient s_i · ∇π."""
    return _ppo_clip(s, r, r.seq_ratio * (r.logp - r.logp.detach()).exp())


@surrogate("m2po")
def _m2po(s: AlgorithmSpec, r: Ratios) -> TokenLoss:
    keep = r.selected
    return TokenLoss(-keep * r.live * r.adv, None, r.ratio, keep == 0)


@surrogate("cispo")
def _cispo(s: AlgorithmSpec, r: Ratios) -> TokenLoss:
    weight = r.ratio.clamp(1 - s.eps_low, 1 + s.eps_high)
    return TokenLoss(-weight * r.adv * r.logp, (weight != r.ratio).to(r.logp.dtype), weight)


@surrogate("sapo")
def _sapo(s: AlgorithmSpec, r: Ratios) -> TokenLoss:
    tau = torch.where(r.adv > 0, s.sapo_tau_pos, s.sapo_tau_neg).to(r.logp.dtype)
    gate = torch.sigmoid(tau * (r.live - 1))
    g = gate.detach()
    return TokenLoss(-(4 / tau) * gate * r.adv, None, 4 * g * (1 - g) * r.ratio)


@surrogate("gmpo")
def _gmpo(s: AlgorithmSpec, r: Ratios) -> TokenLoss:
    """GMPO: per sequence −A·exp(mean_t c_t), c_t the sign-aware clip of x_t = π − anchor in
    log space; broadcast to the sequence's tokens (seq-mean-token-mean then means over
    sequences)."""
    x, adv, m = r.logp - r.anchor, r.adv, r.m
    sign = torch.where(adv < 0, -1.0, 1.0).to(x.dtype)
    bounded = x.clamp(-s.eps_low, s.eps_high)
    clipped = (sign * bounded < sign * x) & (adv != 0)
    c = torch.where(clipped, bounded.detach(), x)
    mean_c = (c * m).sum(dim=1, keepdim=True) / m.sum(dim=1, keepdim=True).clamp(min=1)
    geo = mean_c.exp()
    per_seq = -adv * geo
    weight = torch.where(clipped, torch.zeros_like(x), geo.detach().expand_as(x))
    return TokenLoss(per_seq.expand_as(x), clipped.to(x.dtype), weight)


@surrogate("topr")
def _topr(s: AlgorithmSpec, r: Ratios) -> TokenLoss:
    weight = torch.where(r.adv <= 0, r.ratio.clamp(0, 1), torch.ones_like(r.ratio))
    return TokenLoss(-weight * r.adv * r.logp, None, weight)


@surrogate("dppo-tv")
def _dppo_tv(s: AlgorithmSpec, r: Ratios) -> TokenLoss:
    moved = r.logp.detach().exp() - r.anchor.exp()
    removed = ((moved > s.dppo_delta) & (r.adv > 0)) | ((moved < -s.dppo_delta) & (r.adv < 0))
    return TokenLoss(-(~removed).to(r.logp.dtype) * r.adv * r.live, None, r.ratio, removed)


def k3(x: Tensor) -> Tensor:
    return x.exp() - 1 - x


def binary_kl(a: Tensor, b: Tensor) -> Tensor:
    """KL between two Bernoulli distributions given by the token probabilities a and b, each
    clamped to [1e-8, 1 − 1e-8] (AReaL's): a·ln(a/b) + (1−a)·ln((1−a)/(1−b))."""
    a, b = a.clamp(PROB_EPS, 1 - PROB_EPS), b.clamp(PROB_EPS, 1 - PROB_EPS)
    return a * (a / b).log() + (1 - a) * ((1 - a) / (1 - b)).log()


@surrogate("trm")
def _trm(s: AlgorithmSpec, r: Ratios) -> TokenLoss:
    """Trust-region masking: PPO-clip, a response dropped when the largest k3(x) over its tokens
    exceeds δ, x = p − μ under a proximal anchor (fixed for the step) or a loglinear one (its p),
    sg(π) − μ under a behaviour one. Clipping is counted on the responses kept."""
    x = (r.logp.detach() if s.anchor == "behaviour" else r.anchor) - r.behaviour
    worst = torch.where(r.m > 0, k3(x), torch.full_like(x, -math.inf)).amax(dim=1, keepdim=True)
    keep = (worst <= s.trm_delta).to(r.logp.dtype)
    ppo = _ppo_clip(s, r, r.live)
    removed = (keep == 0).expand_as(x)
    return TokenLoss(keep * ppo.per_token, keep * ppo.clipped, keep * ppo.weight, removed, rows=True)


@surrogate("dppo-kl")
def _dppo_kl(s: AlgorithmSpec, r: Ratios) -> TokenLoss:
    """DPPO binary-KL: −A·sg(min(ρ, C))·π, tokens whose binary KL(anchor ‖ π) exceeds δ where
    they moved with their advantage masked."""
    pi = r.logp.detach()
    moved = ((r.adv > 0) & (pi > r.anchor)) | ((r.adv < 0) & (pi < r.anchor))
    removed = moved & (binary_kl(r.anchor.exp(), pi.exp()) > s.dppo_kl_delta)
    weight = r.ratio.clamp(max=s.dppo_ratio_cap) * (~removed).to(pi.dtype)
    return TokenLoss(-r.adv * weight * r.logp, None, weight, removed)


@surrogate("ce-gppo")
def _ce_gppo(s: AlgorithmSpec, r: Ratios) -> TokenLoss:
    """CE-GPPO: −A·ρ inside the clip window; outside it on the clipped side (A < 0 below 1 − ε_low,
    A > 0 above 1 + ε_high) a token keeps the gradient −β·(1 ∓ ε)·A·∇π, its value β·(1 ∓ ε)·(−A)."""
    low, high = 1 - s.eps_low, 1 + s.eps_high
    below = (r.adv < 0) & (r.ratio < low)
    above = (r.adv > 0) & (r.ratio > high)
    unit = (r.logp - r.logp.detach()).exp()  # ρ / sg(ρ): 1, with π's gradient
    scale = torch.where(below, s.cegppo_beta_low * low, s.cegppo_beta_high * high).to(r.logp.dtype)
    clipped = below | above
    per_token = torch.where(clipped, -scale * r.adv * unit, -r.adv * r.live)
    weight = torch.where(clipped, scale, r.ratio)
    return TokenLoss(per_token, clipped.to(r.logp.dtype), weight)


@surrogate("dro")
def _dro(s: AlgorithmSpec, r: Ratios) -> TokenLoss:
    """DRO (verl's form): −(A·π − (β/2)·(π − anchor)²)."""
    x = r.logp - r.anchor
    return TokenLoss(-(r.adv * r.logp - s.dro_beta / 2 * x * x), None, torch.ones_like(r.ratio))


@surrogate("bapo")
def _bapo(s: AlgorithmSpec, r: Ratios) -> TokenLoss:
    """BAPO: PPO-clip on the ratio with the searched bounds (c_low, c_high), no dual clip."""
    low, high, _ = r.bounds
    return _ppo_clip(s, r, r.live, (low, high), dual=False)


def _one_side(s: AlgorithmSpec, r: Ratios, ratio: Tensor) -> Tensor:
    return ((r.adv >= 0) & (ratio <= 1 + s.eps_high)) | ((r.adv <= 0) & (ratio >= 1 - s.eps_low))


def _two_side(s: AlgorithmSpec, r: Ratios) -> Tensor:
    return (r.ratio >= 1 - s.eps_low) & (r.ratio <= 1 + s.eps_high)


# REC's clips (presets.Clip): the tokens kept, bool [N, T].
CLIPS: dict[str, Callable[[AlgorithmSpec, Ratios], Tensor]] = {
    "none": lambda s, r: torch.ones_like(r.ratio, dtype=torch.bool),
    "one-side": lambda s, r: _one_side(s, r, r.ratio),
    "two-side": _two_side,
    "ring": lambda s, r: (
        _two_side(s, r)
        | ((r.adv >= 0) & (r.ratio <= 1 - s.eps_low_prime))
        | ((r.adv <= 0) & (r.ratio >= 1 + s.eps_high_prime))
    ),
    "seq-one-side": lambda s, r: _one_side(s, r, r.seq_ratio).expand_as(r.ratio),
}

# REC's importance weights (presets.Weight), [N, T].
WEIGHTS: dict[str, Callable[[AlgorithmSpec, Ratios], Tensor]] = {
    "none": lambda s, r: torch.ones_like(r.ratio),
    "is": lambda s, r: r.ratio,
    "seq-is": lambda s, r: r.seq_ratio.expand_as(r.ratio),
    "advantage": lambda s, r: (r.adv / s.temp).exp().expand_as(r.ratio),
    "truncated-is": lambda s, r: r.ratio.clamp(1 - s.eps_low_prime, 1 + s.eps_high_prime),
}


def _nothing_removed(q: Tensor) -> Tensor:
    return torch.zeros_like(q, dtype=torch.bool)


def _weighted_unless(q: Tensor, removed: Tensor) -> tuple[Tensor, Tensor]:
    return torch.where(removed, torch.zeros_like(q), q), removed


def _masked_is(s: AlgorithmSpec, q: Tensor, r: Ratios) -> tuple[Tensor, Tensor]:
    removed = (q < s.is_low) | (q > s.is_high)
    return (~removed).to(q.dtype), removed


def _kpop(s: AlgorithmSpec, q: Tensor, r: Ratios) -> tuple[Tensor, Tensor]:
    """q, with tokens masked whose binary KL between the anchor's and μ's probabilities exceeds φ
    in either direction."""
    p, mu = r.anchor.exp(), r.behaviour.exp()
    return _weighted_unless(q, torch.maximum(binary_kl(p, mu), binary_kl(mu, p)) > s.kpop_phi)


# The behaviour corrections (presets.Correction) applied on top of the surrogate: (the behaviour
# weight q [N, T], the head) -> (the weight applied, the tokens removed).
CORRECTIONS: dict[str, Callable[[AlgorithmSpec, Tensor, Ratios], tuple[Tensor, Tensor]]] = {
    "none": lambda s, q, r: (torch.ones_like(q), _nothing_removed(q)),
    "decoupled": lambda s, q, r: _weighted_unless(q, q > s.is_cap),
    "tis": lambda s, q, r: (q.clamp(max=s.is_cap), _nothing_removed(q)),
    "mis": _masked_is,
    "icepop": lambda s, q, r: _weighted_unless(q, (q < s.is_low) | (q > s.is_high)),
    "kpop": _kpop,
}

# The regularisers (presets.Reg): the per-token loss with the term added.
REGULARISERS: dict[str, Callable[[AlgorithmSpec, Ratios, Tensor], Tensor]] = {
    "none": lambda s, r, loss: loss,
    "k2": lambda s, r, loss: loss + s.reg_coef * (r.logp - r.anchor) ** 2,
    "forward-kl": lambda s, r, loss: loss - s.reg_coef * r.logp,
}


def _token_mean(summed: Tensor, m: Tensor, n_seqs: int, total_tokens: float | None, _: int | None) -> Tensor:
    return summed.sum() / (total_tokens if total_tokens is not None else m.sum().clamp(min=1))


def _seq_mean_token_mean(summed: Tensor, m: Tensor, n_seqs: int, *_: object) -> Tensor:
    return (summed.sum(dim=1) / m.sum(dim=1).clamp(min=1)).sum() / n_seqs


def _seq_mean_token_sum_norm(
    summed: Tensor, m: Tensor, n_seqs: int, _: float | None, max_length: int | None
) -> Tensor:
    # Dr.-GRPO: divide by a constant (the maximum response length), not by each length.
    return summed.sum() / (n_seqs * (max_length or summed.shape[1]))


# The aggregations (presets.LossAgg): (loss × mask, mask, sequences, total tokens, max length) ->
# the scalar loss; the totals are the whole (mini-)batch's under gradient accumulation.
AGGREGATIONS: dict[str, Callable[[Tensor, Tensor, int, float | None, int | None], Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum": lambda summed, m, n_seqs, *_: summed.sum() / n_seqs,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}
