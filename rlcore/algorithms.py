"""The loss family (docs/algorithms.md §2–5, §13) as pure tensor functions: `build(name, **params)` gives
an `Algorithm` whose `advantages` are group-relative (with RED-Drop) and whose `policy_loss` has the
spec's gradient with respect to `logp`. Shapes: N responses, T response positions."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlcore.presets import AlgorithmSpec, preset_names, resolve

STD_EPS = 1e-6


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

    def anchor_logp(self, logp_old: Tensor, logp_prox: Tensor | None) -> Tensor:
        """The log-probs the ratio is taken against: μ (behaviour) or p (proximal); μ for a loss
        that reads no ratio."""
        if self.spec.anchor == "behaviour" or not self.spec.reads_ratio:
            return logp_old
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
        total_tokens: float | None = None,
        total_seqs: int | None = None,
        max_length: int | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        """Scalar loss whose gradient w.r.t. `logp` [N, T] is the preset's, plus statistics.

        `logp_old` [N, T] are the behaviour log-probs μ recorded at rollout; `logp_prox` [N, T]
        the trainer's own log-probs under the step-start weights (needed when anchored on them);
        `mask` [N, T] is 1 on response tokens; `advantages` [N]. `selected` is M2PO's whole-batch
        mask (`selection`); without it M2PO selects over the rows given. For gradient
        accumulation over micro-batches, pass the whole (mini-)batch's `total_tokens` /
        `total_seqs` so that the sum of micro-batch losses equals its loss. `max_length` is the
        constant that `seq-mean-token-sum-norm` divides by (default: T).
        """
        s = self.spec
        m = mask.to(logp.dtype)
        anchor = self.anchor_logp(logp_old, logp_prox)
        adv = self._effective(advantages, logp, logp_old, m)[:, None]
        dropped = (adv == 0) & (advantages.detach().to(logp.dtype)[:, None] != 0)
        log_ratio = logp.detach() - anchor
        ratio = log_ratio.exp()
        tokens_per_seq = m.sum(dim=1).clamp(min=1)
        seq_ratio = ((log_ratio * m).sum(dim=1) / tokens_per_seq).exp()[:, None]
        live = (logp - anchor).exp()  # the ratio with its gradient
        ones = torch.ones_like(ratio)
        removed = torch.zeros_like(ratio, dtype=torch.bool)  # tokens a mask takes out of the loss

        if s.surrogate == "rec":
            keep = self._clip_mask(ratio, seq_ratio, adv)
            weight = self._weight(ratio, seq_ratio, adv)
            per_token = -adv * weight * logp * keep
            clipped = 1 - keep
            weight = weight * keep  # a clipped token gets no gradient: no weight applied
        elif s.surrogate in ("ppo", "gspo"):
            if s.surrogate == "gspo":  # value sg(s_i), gradient s_i · ∇logp
                live = seq_ratio * (logp - logp.detach()).exp()
            unclipped = -adv * live
            clipped_branch = -adv * live.clamp(1 - s.eps_low, 1 + s.eps_high)
            per_token = torch.maximum(unclipped, clipped_branch)
            clipped = (clipped_branch > unclipped).to(logp.dtype)
            weight = live.detach() * (1 - clipped)
            if s.dual_clip is not None:
                cap = -adv * s.dual_clip
                dual = (adv < 0) & (per_token > cap)
                per_token = torch.where(dual, cap.expand_as(per_token), per_token)
                clipped = torch.maximum(clipped, dual.to(logp.dtype))
        elif s.surrogate == "m2po":
            keep = (
                selected
                if selected is not None
                else self.selection(logp, logp_old, mask, advantages, logp_prox)
            )
            removed = keep == 0
            per_token = -keep * live * adv
            clipped, weight = torch.zeros_like(ratio), ratio
        elif s.surrogate == "cispo":
            weight = ratio.clamp(1 - s.eps_low, 1 + s.eps_high)
            per_token = -weight * adv * logp
            clipped = (weight != ratio).to(logp.dtype)
        elif s.surrogate == "sapo":
            tau = torch.where(adv > 0, s.sapo_tau_pos, s.sapo_tau_neg).to(logp.dtype)
            gate = torch.sigmoid(tau * (live - 1))
            per_token = -(4 / tau) * gate * adv
            g = gate.detach()
            clipped, weight = torch.zeros_like(ratio), 4 * g * (1 - g) * ratio
        elif s.surrogate == "gmpo":
            per_token, clipped, weight = self._gmpo(logp - anchor, adv, m)
        elif s.surrogate == "topr":
            weight = torch.where(adv <= 0, ratio.clamp(0, 1), ones)
            per_token = -weight * adv * logp
            clipped = torch.zeros_like(ratio)
        elif s.surrogate == "dppo-tv":
            moved = logp.detach().exp() - anchor.exp()
            removed = ((moved > s.dppo_delta) & (adv > 0)) | ((moved < -s.dppo_delta) & (adv < 0))
            per_token = -(~removed).to(logp.dtype) * adv * live
            clipped, weight = torch.zeros_like(ratio), ratio
        else:
            raise ValueError(f"unknown surrogate {s.surrogate!r}")

        q = (anchor - logp_old).exp()  # the behaviour weight π_prox/μ; 1 under a behaviour anchor
        q_weight, q_removed = self._correction(q)
        per_token = q_weight * per_token
        weight = weight * q_weight
        removed = removed | q_removed
        if s.reg == "k2":
            per_token = per_token + s.reg_coef * (logp - anchor) ** 2
        elif s.reg == "forward-kl":
            per_token = per_token - s.reg_coef * logp
        if s.opsm_delta is not None:
            per_token = torch.where(dropped, torch.zeros_like(per_token), per_token)
            removed = removed | dropped

        loss = self._aggregate(per_token, m, total_tokens, total_seqs, max_length)
        stats = self.statistics(logp.detach(), logp_old, m, clipped.detach(), removed, weight.detach())
        return loss, stats

    @staticmethod
    def statistics(
        logp: Tensor, logp_old: Tensor, m: Tensor, clipped: Tensor, removed: Tensor, weight: Tensor
    ) -> dict[str, float]:
        """Per-step diagnostics (§7, §14) over the valid tokens: the behaviour ratio ρ = e^{π−μ}'s
        quantiles and effective sample size, the share a clip acted on, the share a mask removed,
        and the mean importance weight the loss applied to the tokens it kept."""
        valid = m > 0
        log_ratio = logp - logp_old
        ratio = log_ratio.exp()
        values = ratio[valid].to(torch.float64)
        if values.numel() == 0:
            values = torch.ones(1, dtype=torch.float64)
        quantiles = torch.quantile(values, torch.tensor([0.01, 0.5, 0.99], dtype=torch.float64))
        kept = valid & ~removed.expand_as(valid)
        return {
            "clip_frac": float(_masked_mean(clipped, m)),
            "is_ratio/mean": float(values.mean()),
            "is_ratio/min": float(values.min()),
            "is_ratio/p01": float(quantiles[0]),
            "is_ratio/p50": float(quantiles[1]),
            "is_ratio/p99": float(quantiles[2]),
            "is_ratio/max": float(values.max()),
            "ess_frac": float(values.sum() ** 2 / (values.numel() * (values**2).sum())),
            "correction/masked_frac": float(_masked_mean(removed.expand_as(m).to(m.dtype), m)),
            "correction/weight_mean": float(weight[kept].mean()) if kept.any() else 1.0,
            "kl/behavior": float(_masked_mean(-log_ratio, m)),
            "kl/behavior_k3": float(_masked_mean(ratio - 1 - log_ratio, m)),
        }

    def _correction(self, q: Tensor) -> tuple[Tensor, Tensor]:
        """(weight, removed) of the behaviour correction applied on top of the surrogate."""
        s = self.spec
        none = torch.zeros_like(q, dtype=torch.bool)
        if s.correction == "none":
            return torch.ones_like(q), none
        if s.correction == "decoupled":
            removed = q > s.is_cap
            return torch.where(removed, torch.zeros_like(q), q), removed
        if s.correction == "tis":
            return q.clamp(max=s.is_cap), none
        if s.correction == "mis":
            removed = (q < s.is_low) | (q > s.is_high)
            return (~removed).to(q.dtype), removed
        raise ValueError(f"unknown correction {s.correction!r}")

    def _gmpo(self, x: Tensor, adv: Tensor, m: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """GMPO: per sequence −A·exp(mean_t c_t), c_t the sign-aware clip of x_t = π − anchor in
        log space; broadcast to the sequence's tokens (seq-mean-token-mean then means over
        sequences). Returns (per-token loss, clipped, gradient weight)."""
        s = self.spec
        sign = torch.where(adv < 0, -1.0, 1.0).to(x.dtype)
        bounded = x.clamp(-s.eps_low, s.eps_high)
        clipped = (sign * bounded < sign * x) & (adv != 0)
        c = torch.where(clipped, bounded.detach(), x)
        mean_c = (c * m).sum(dim=1, keepdim=True) / m.sum(dim=1, keepdim=True).clamp(min=1)
        geo = mean_c.exp()
        per_seq = -adv * geo
        weight = torch.where(clipped, torch.zeros_like(x), geo.detach().expand_as(x))
        return per_seq.expand_as(x), clipped.to(x.dtype), weight

    def _clip_mask(self, ratio: Tensor, seq_ratio: Tensor, adv: Tensor) -> Tensor:
        s = self.spec
        lo, hi = 1 - s.eps_low, 1 + s.eps_high
        pos, neg = adv >= 0, adv <= 0
        if s.clip == "none":
            keep = torch.ones_like(ratio, dtype=torch.bool)
        elif s.clip == "one-side":
            keep = (pos & (ratio <= hi)) | (neg & (ratio >= lo))
        elif s.clip == "seq-one-side":
            keep = ((pos & (seq_ratio <= hi)) | (neg & (seq_ratio >= lo))).expand_as(ratio)
        elif s.clip == "two-side":
            keep = (ratio >= lo) & (ratio <= hi)
        elif s.clip == "ring":
            inner = (ratio >= lo) & (ratio <= hi)
            keep = inner | (pos & (ratio <= 1 - s.eps_low_prime)) | (neg & (ratio >= 1 + s.eps_high_prime))
        else:
            raise ValueError(f"unknown clip {s.clip!r}")
        return keep.to(ratio.dtype)

    def _weight(self, ratio: Tensor, seq_ratio: Tensor, adv: Tensor) -> Tensor:
        s = self.spec
        if s.weight == "none":
            return torch.ones_like(ratio)
        if s.weight == "is":
            return ratio
        if s.weight == "seq-is":
            return seq_ratio.expand_as(ratio)
        if s.weight == "advantage":
            return (adv / s.temp).exp().expand_as(ratio)
        if s.weight == "truncated-is":
            return ratio.clamp(1 - s.eps_low_prime, 1 + s.eps_high_prime)
        raise ValueError(f"unknown weight {s.weight!r}")

    def _aggregate(
        self,
        per_token: Tensor,
        m: Tensor,
        total_tokens: float | None,
        total_seqs: int | None,
        max_length: int | None,
    ) -> Tensor:
        agg = self.spec.loss_agg
        summed = per_token * m
        n_seqs = total_seqs if total_seqs is not None else per_token.shape[0]
        if agg == "token-mean":
            denom = total_tokens if total_tokens is not None else m.sum().clamp(min=1)
            return summed.sum() / denom
        if agg == "seq-mean-token-mean":
            return (summed.sum(dim=1) / m.sum(dim=1).clamp(min=1)).sum() / n_seqs
        if agg == "seq-mean-token-sum":
            return summed.sum() / n_seqs
        if agg == "seq-mean-token-sum-norm":
            # Dr.-GRPO: divide by a constant (the maximum response length), not by each length.
            return summed.sum() / (n_seqs * (max_length or per_token.shape[1]))
        raise ValueError(f"unknown loss_agg {agg!r}")
