"""The plain implementation the field's losses are held to (docs/algorithms.md §11, §16): each
preset's per-token loss and gradient written from the formulas with Python floats, the worked
example's batch, and random batches (varied lengths, A = 0 ties, lags). Shared by
test_field_losses.py and test_loglinear_anchor.py."""

import math
import random

from rlcore import algorithms

RATIOS = [[1.1, 1.5], [0.7, 3.5], [2.0, 0.3], [0.3, 0.6]]
Q = [[1.0, 1.2], [0.9, 6.0], [1.5, 0.4], [1.0, 0.8]]  # behaviour weights p/μ: p = μ + ln q
REWARDS = [1.0, 0.0, 0.0, 1.0]
MU = -1.5


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def binary_kl(a, b):
    a, b = min(max(a, 1e-8), 1 - 1e-8), min(max(b, 1e-8), 1 - 1e-8)
    return a * math.log(a / b) + (1 - a) * math.log((1 - a) / (1 - b))


def k3(x):
    return math.exp(x) - 1 - x


def bapo_bounds(spec, tokens):
    """BAPO's search as the authors' loop, over (ρ, A) of the batch's valid tokens."""

    def balance(low, high):
        if not any(a < 0 for _, a in tokens):
            return math.inf
        positive = sum(min(rho, high) * a for rho, a in tokens if a >= 0)
        negative = sum(max(rho, low) * -a for rho, a in tokens if a < 0)
        return positive / (negative + 1e-8)

    low, high = spec.bapo_low_start, spec.bapo_high_start
    while balance(low, high) < spec.bapo_target and low < spec.bapo_low_end:
        low = min(low + spec.bapo_low_step, spec.bapo_low_end)
    while balance(low, high) < spec.bapo_target and high < spec.bapo_high_end:
        high = min(high + spec.bapo_high_step, spec.bapo_high_end)
    return low, high, balance(low, high)


def loglinear_alpha(d):
    """A-3PO's weight for a lag of d versions: (d − 1)/d within [0, 1], 0 for d ≤ 0."""
    return min(max((d - 1) / d, 0.0), 1.0) if d > 0 else 0.0


def reference(preset, params, pi, mu, prox, mask, adv_in, lag=None):
    """(loss, ∂loss/∂π) for one batch, token by token in plain floats (lists of rows); `lag`, one
    per row, is what a loglinear anchor reads (p = μ + α·(π − μ), held constant in the gradient)."""
    spec = algorithms.build(preset, **params).spec
    anchor = prox if spec.anchor == "proximal" else mu
    if spec.anchor == "loglinear":
        anchor = [
            [m + loglinear_alpha(lag[i]) * (x - m) for x, m in zip(pi[i], mu[i], strict=True)]
            for i in range(len(pi))
        ]
    n = len(pi)
    valid = [[t for t in range(len(pi[i])) if mask[i][t]] for i in range(n)]
    n_tok = sum(len(v) for v in valid)
    adv = list(adv_in)
    dropped = [False] * n
    if spec.opsm_delta is not None:
        for i in range(n):
            drift = sum(mu[i][t] - pi[i][t] for t in valid[i]) / max(1, len(valid[i]))
            if adv[i] < 0 and drift > spec.opsm_delta:
                adv[i], dropped[i] = 0.0, True
    keep_m2 = {}
    if spec.surrogate == "m2po":
        tokens = [(i, t) for i in range(n) for t in valid[i]]
        # Selected by the data's age, (π − μ)², whatever the anchor (AReaL's form).
        sq = {(i, t): (pi[i][t] - mu[i][t]) ** 2 for i, t in tokens}

        def may_go(i, t):
            if not spec.m2po_quadrants:
                return True
            x = pi[i][t] - mu[i][t]
            return (adv[i] > 0 and x > 0) or (adv[i] < 0 and x < 0)

        order = sorted([k for k in tokens if may_go(*k)], key=lambda k: -sq[k])  # stable: row order on ties
        left = set(tokens)
        for k in order:
            if sum(sq[j] for j in left) / len(left) <= spec.m2po_tau + 1e-12:
                break
            left.discard(k)
        keep_m2 = {k: k in left for k in tokens}

    # TRM keeps a response whose largest k3(x) is within δ; x = p − μ (proximal, loglinear), π − μ
    # (behaviour).
    trm_keep = [
        max(
            [
                k3(pi[i][t] - mu[i][t] if spec.anchor == "behaviour" else anchor[i][t] - mu[i][t])
                for t in valid[i]
            ]
        )
        <= spec.trm_delta
        if valid[i]
        else True
        for i in range(n)
    ]
    if spec.surrogate == "bapo":
        low, high, _ = bapo_bounds(
            spec, [(math.exp(pi[i][t] - anchor[i][t]), adv[i]) for i in range(n) for t in valid[i]]
        )

    loss, grad = 0.0, [[0.0] * len(pi[i]) for i in range(n)]
    seq_level = spec.loss_agg == "seq-mean-token-mean"
    for i in range(n):
        if not valid[i]:
            continue
        a = adv[i]
        scale = 1 / (n * len(valid[i])) if seq_level else 1 / n_tok
        if spec.surrogate == "gmpo":
            sign = -1.0 if a < 0 else 1.0
            cs, clipped = [], []
            for t in valid[i]:
                x = pi[i][t] - anchor[i][t]
                bounded = min(max(x, -spec.eps_low), spec.eps_high)
                c = sign * min(sign * x, sign * bounded)
                cs.append(c)
                clipped.append(c != x and a != 0)
            geo = math.exp(sum(cs) / len(cs))
            if not dropped[i]:
                loss += -a * geo / n
                for t, cut in zip(valid[i], clipped, strict=True):
                    grad[i][t] = 0.0 if cut else -a * geo / len(valid[i]) / n
            continue
        for t in valid[i]:
            x = pi[i][t] - anchor[i][t]
            rho = math.exp(x)
            q = math.exp(anchor[i][t] - mu[i][t])
            if spec.surrogate in ("ppo", "trm", "bapo"):
                lo, hi = (low, high) if spec.surrogate == "bapo" else (1 - spec.eps_low, 1 + spec.eps_high)
                unclipped, capped = -a * rho, -a * min(max(rho, lo), hi)
                value, d = (capped, 0.0) if capped > unclipped else (unclipped, -a * rho)
                if not trm_keep[i] and spec.surrogate == "trm":
                    value, d = 0.0, 0.0
            elif spec.surrogate == "dppo-kl":
                moved = (a > 0 and pi[i][t] > anchor[i][t]) or (a < 0 and pi[i][t] < anchor[i][t])
                out = moved and binary_kl(math.exp(anchor[i][t]), math.exp(pi[i][t])) > spec.dppo_kl_delta
                w = 0.0 if out else min(rho, spec.dppo_ratio_cap)
                value, d = -a * w * pi[i][t], -a * w
            elif spec.surrogate == "ce-gppo":
                lo, hi = 1 - spec.eps_low, 1 + spec.eps_high
                if a < 0 and rho < lo:
                    value = d = -spec.cegppo_beta_low * lo * a
                elif a > 0 and rho > hi:
                    value = d = -spec.cegppo_beta_high * hi * a
                else:
                    value, d = -a * rho, -a * rho
            elif spec.surrogate == "dro":
                value, d = -(a * pi[i][t] - spec.dro_beta / 2 * x * x), -a + spec.dro_beta * x
            elif spec.surrogate == "m2po":
                kept = keep_m2[(i, t)]
                value, d = (-rho * a, -rho * a) if kept else (0.0, 0.0)
            elif spec.surrogate == "cispo":
                w = min(max(rho, 1 - spec.eps_low), 1 + spec.eps_high)
                value, d = -w * a * pi[i][t], -w * a
            elif spec.surrogate == "sapo":
                tau = spec.sapo_tau_pos if a > 0 else spec.sapo_tau_neg
                g = sigmoid(tau * (rho - 1))
                value, d = -(4 / tau) * g * a, -4 * g * (1 - g) * rho * a
            elif spec.surrogate == "topr":
                w = min(max(rho, 0.0), 1.0) if a <= 0 else 1.0
                value, d = -w * a * pi[i][t], -w * a
            elif spec.surrogate == "dppo-tv":
                moved = math.exp(pi[i][t]) - math.exp(anchor[i][t])
                out = (moved > spec.dppo_delta and a > 0) or (moved < -spec.dppo_delta and a < 0)
                value, d = (0.0, 0.0) if out else (-a * rho, -a * rho)
            else:
                raise AssertionError(spec.surrogate)
            factor = {
                "none": 1.0,
                "decoupled": q if q <= spec.is_cap else 0.0,
                "tis": min(q, spec.is_cap),
                "mis": 1.0 if spec.is_low <= q <= spec.is_high else 0.0,
                "icepop": q if spec.is_low <= q <= spec.is_high else 0.0,
                "kpop": q
                if max(
                    binary_kl(math.exp(anchor[i][t]), math.exp(mu[i][t])),
                    binary_kl(math.exp(mu[i][t]), math.exp(anchor[i][t])),
                )
                <= spec.kpop_phi
                else 0.0,
            }[spec.correction]
            value, d = factor * value, factor * d
            if spec.reg == "k2":
                value, d = value + spec.reg_coef * x * x, d + 2 * spec.reg_coef * x
            if dropped[i]:
                value, d = 0.0, 0.0
            loss += value * scale
            grad[i][t] = d * scale
    return loss, grad


def group_advantages(rewards, k, normalise):
    out = []
    for g in range(0, len(rewards), k):
        group = rewards[g : g + k]
        mean = sum(group) / k
        sigma = math.sqrt(sum((r - mean) ** 2 for r in group) / (k - 1))
        out += [(r - mean) / (sigma + 1e-6) if normalise else r - mean for r in group]
    return out


CASES = [
    ("decoupled-ppo", {}),
    ("decoupled-ppo", {"anchor": "behaviour"}),
    ("grpo-tis", {}),
    ("grpo-tis", {"is_cap": 1.3}),
    ("grpo-mis", {}),
    ("grpo-mis", {"anchor": "behaviour"}),
    ("m2po", {}),
    ("m2po", {"m2po_quadrants": True}),
    ("m2po", {"anchor": "proximal", "m2po_tau": 0.01}),
    ("cispo", {}),
    ("cispo", {"anchor": "proximal"}),
    ("sapo", {}),
    ("sapo", {"anchor": "proximal", "sapo_tau_neg": 2.0}),
    ("gmpo", {}),
    ("gmpo", {"anchor": "proximal", "eps_high": 0.1}),
    ("topr", {}),
    ("topr", {"anchor": "proximal"}),
    ("dppo-tv", {}),
    ("dppo-tv", {"anchor": "proximal", "dppo_delta": 0.05}),
    ("grpo", {"opsm_delta": 0.05}),
    ("grpo", {"anchor": "proximal"}),
    ("grpo-tis", {"opsm_delta": 0.05}),
    ("cispo", {"opsm_delta": 0.05}),
    # §16
    ("icepop", {}),
    ("icepop", {"anchor": "behaviour"}),
    ("icepop", {"is_low": 0.8, "is_high": 1.2}),
    ("kpop", {}),
    ("kpop", {"kpop_phi": 0.02}),
    ("kpop", {"anchor": "behaviour", "kpop_phi": 0.02}),
    ("trm", {}),
    ("trm", {"anchor": "behaviour"}),
    ("trm", {"trm_delta": 0.05}),
    ("dppo-kl", {}),
    ("dppo-kl", {"anchor": "proximal", "dppo_kl_delta": 0.01}),
    ("dppo-kl", {"dppo_ratio_cap": 1.2}),
    ("ce-gppo", {}),
    ("ce-gppo", {"anchor": "proximal", "cegppo_beta_low": 1.0, "eps_high": 0.1}),
    ("dro", {}),
    ("dro", {"anchor": "proximal", "dro_beta": 0.5}),
    ("bapo", {}),
    ("bapo", {"anchor": "proximal"}),
    ("bapo", {"bapo_target": 2.0, "bapo_high_step": 0.3, "bapo_low_start": 0.2}),
    ("bapo", {"opsm_delta": 0.05}),
]


def random_batch(seed, k=4, groups=4, width=6):
    rng = random.Random(seed)
    n = k * groups
    lengths = [rng.randint(1, width) for _ in range(n)]
    mask = [[1.0 if t < lengths[i] else 0.0 for t in range(width)] for i in range(n)]
    mu = [[-rng.uniform(0.05, 3.0) for _ in range(width)] for _ in range(n)]
    pi = [[m + rng.gauss(0, 0.5) for m in row] for row in mu]
    prox = [[m + rng.gauss(0, 0.3) for m in row] for row in mu]
    # Ties: a group whose rewards are all equal (A = 0 throughout) and rewards equal to their mean.
    rewards = [1.0] * k + [0.0, 0.5, 1.0, 0.5] + [float(rng.random() < 0.5) for _ in range(n - 2 * k)]
    return pi, mu, prox, mask, rewards
