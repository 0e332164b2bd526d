"""The loss family (docs/algorithms.md §2–5) as pure tensor functions: `build(name, **params)` gives
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

    def policy_loss(
        self,
        logp: Tensor,
        logp_old: Tensor,
        mask: Tensor,
        advantages: Tensor,
        *,
        total_tokens: float | None = None,
        total_seqs: int | None = None,
        max_length: int | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        """Scalar loss whose gradient w.r.t. `logp` [N, T] is the preset's, plus statistics.

        `logp_old` [N, T] are the behaviour log-probs recorded at rollout; `mask` [N, T] is 1
        on response tokens; `advantages` [N]. For gradient accumulation over micro-batches,
        pass the whole batch's `total_tokens` / `total_seqs` so that the sum of micro-batch
        losses equals the full-batch loss. `max_length` is the constant that
        `seq-mean-token-sum-norm` divides by (default: T).
        """
        s = self.spec
        m = mask.to(logp.dtype)
        adv = advantages.detach().to(logp.dtype)[:, None]
        log_ratio = logp.detach() - logp_old
        ratio = log_ratio.exp()
        tokens_per_seq = m.sum(dim=1).clamp(min=1)
        seq_ratio = ((log_ratio * m).sum(dim=1) / tokens_per_seq).exp()[:, None]

        if s.surrogate == "rec":
            keep = self._clip_mask(ratio, seq_ratio, adv)
            per_token = -adv * self._weight(ratio, seq_ratio, adv) * logp * keep
            if s.reg == "k2":
                per_token = per_token + s.reg_coef * (logp - logp_old) ** 2
            elif s.reg == "forward-kl":
                per_token = per_token - s.reg_coef * logp
            clipped = 1 - keep
        else:
            if s.surrogate == "ppo":
                live_ratio = (logp - logp_old).exp()
            else:  # gspo: value sg(s_i), gradient s_i · ∇logp
                live_ratio = seq_ratio * (logp - logp.detach()).exp()
            unclipped = -adv * live_ratio
            clipped_branch = -adv * live_ratio.clamp(1 - s.eps_low, 1 + s.eps_high)
            per_token = torch.maximum(unclipped, clipped_branch)
            clipped = (clipped_branch > unclipped).to(logp.dtype)
            if s.dual_clip is not None:
                cap = -adv * s.dual_clip
                dual = (adv < 0) & (per_token > cap)
                per_token = torch.where(dual, cap.expand_as(per_token), per_token)
                clipped = torch.maximum(clipped, dual.to(logp.dtype))

        loss = self._aggregate(per_token, m, total_tokens, total_seqs, max_length)
        stats = {
            "clip_frac": float(_masked_mean(clipped.detach(), m)),
            "is_ratio/mean": float(_masked_mean(ratio, m)),
            "is_ratio/max": float(ratio.masked_fill(m == 0, float("-inf")).max()) if m.any() else 1.0,
            "kl/behavior": float(_masked_mean(-log_ratio, m)),
            "kl/behavior_k3": float(_masked_mean(ratio - 1 - log_ratio, m)),
        }
        return loss, stats

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
