"""The field's staleness-robust losses (docs/algorithms.md §13): every new preset against the
worked example, and against an independent implementation written here from the formulas (plain
Python floats, gradients by hand) on random batches with varied lengths, A = 0 ties and both
anchors."""

import math
import random

import pytest
import torch

from rlcore import algorithms

RATIOS = [[1.1, 1.5], [0.7, 3.5], [2.0, 0.3], [0.3, 0.6]]
Q = [[1.0, 1.2], [0.9, 6.0], [1.5, 0.4], [1.0, 0.8]]  # behaviour weights p/μ: p = μ + ln q
REWARDS = [1.0, 0.0, 0.0, 1.0]
MU = -1.5

# (preset, overrides): (per-token gradient × 8, loss, the statistic the share is read from, share)
TABLE = {
    ("decoupled-ppo", ()): ([-0.9526, 0, 0, 0, 1.7320, 0, -0.2598, -0.5196], -0.043301, "clip_frac", 0.5),
    ("grpo-tis", ()): ([-0.9526, 0, 0, 0, 1.7320, 0, -0.2598, -0.5196], 0.129904, "clip_frac", 0.5),
    ("grpo-mis", ()): ([-0.9526, 0, 0, 0, 1.1547, 0, -0.2598, -0.6495], -0.131708, "clip_frac", 0.5),
    ("m2po", ()): ([-0.9526, 0, 0, 0, 0, 0, 0, 0], -0.119078, "correction/masked_frac", 0.875),
    ("m2po", (("m2po_quadrants", True),)): (
        [0, 0, 0, 3.0311, 1.7320, 0, -0.2598, -0.5196],
        0.497964,
        "correction/masked_frac",
        0.5,
    ),
    ("cispo", ()): (
        [-0.9526, -1.1085, 0.6062, 1.1085, 1.1085, 0.2598, -0.2598, -0.5196],
        0.162786,
        "clip_frac",
        0.375,
    ),
    ("sapo", ()): (
        [-0.9502, -1.2211, 0.5914, 0.7636, 1.3304, 0.2277, -0.2304, -0.4994],
        0.183362,
        "clip_frac",
        0,
    ),
    ("gmpo", ()): ([-1.1094, 0, 1.3555, 1.3555, 1.0027, 0, -0.3674, -0.3674], 0.220365, "clip_frac", 0.25),
    ("topr", ()): ([-0.5, -0.5, 0.35, 0.5, 0.5, 0.15, -0.5, -0.5], 0.253067, "clip_frac", 0),
    ("dppo-tv", ()): (
        [-0.5498, -0.7492, 0.3493, 1.7525, 1.0014, 0.1476, -0.1524, -0.3010],
        0.188189,
        "clip_frac",
        0,
    ),
    ("grpo", (("opsm_delta", 0.1),)): (
        [-0.9526, 0, 0, 3.0311, 0, 0, -0.2598, -0.5196],
        0.119078,
        "clip_frac",
        0.25,
    ),
}
# Tokens each mask removed in the example: decoupled PPO's cap (q 6 > 5), MIS ([0.5, 5]: q 6 and 0.4),
# OPSM (y3, whose mean μ − π is 0.255 > 0.1).
MASKED = {"decoupled-ppo": 0.125, "grpo-mis": 0.25, "grpo": 0.25, "grpo-tis": 0, "dppo-tv": 0, "cispo": 0}


def example(preset, overrides):
    algo = algorithms.build(preset, **dict(overrides))
    mu = torch.full((4, 2), MU, dtype=torch.float64)
    logp = (mu + torch.tensor(RATIOS, dtype=torch.float64).log()).requires_grad_()
    prox = mu + torch.tensor(Q, dtype=torch.float64).log()
    adv = algo.advantages(torch.tensor(REWARDS, dtype=torch.float64), 4)
    loss, stats = algo.policy_loss(logp, mu, torch.ones(4, 2, dtype=torch.float64), adv, logp_prox=prox)
    loss.backward()
    return logp.grad.flatten() * 8, float(loss.detach()), stats


@pytest.mark.parametrize("key", list(TABLE), ids=lambda k: k[0] + "".join(f"+{n}" for n, _ in k[1]))
def test_worked_example(key):
    grad, loss, stats = example(*key)
    expected_grad, expected_loss, share_of, share = TABLE[key]
    assert grad.tolist() == pytest.approx(expected_grad, abs=1e-4)
    assert loss == pytest.approx(expected_loss, abs=1e-4)
    assert stats[share_of] == pytest.approx(share, abs=1e-4)
    if key[0] in MASKED:
        assert stats["correction/masked_frac"] == pytest.approx(MASKED[key[0]], abs=1e-9)


def test_the_anchor_is_what_makes_tis_differ_from_grpo():
    """Under a behaviour anchor q ≡ 1: grpo-tis is GRPO exactly."""
    tis, _, _ = example("grpo-tis", (("anchor", "behaviour"),))
    grpo, _, _ = example("grpo", ())
    assert torch.allclose(tis, grpo, atol=1e-12)


def test_proximal_anchor_needs_the_proximal_logprobs():
    algo = algorithms.build("decoupled-ppo")
    mu = torch.zeros(4, 2)
    with pytest.raises(ValueError, match="proximal"):
        algo.policy_loss(mu.clone(), mu, torch.ones(4, 2), torch.zeros(4))


# ----- an independent implementation, from the formulas ------------------------------------------


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def reference(preset, params, pi, mu, prox, mask, adv_in):
    """(loss, ∂loss/∂π) for one batch, token by token in plain floats (lists of rows)."""
    spec = algorithms.build(preset, **params).spec
    anchor = prox if spec.anchor == "proximal" else mu
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
            if spec.surrogate == "ppo":
                lo, hi = 1 - spec.eps_low, 1 + spec.eps_high
                unclipped, capped = -a * rho, -a * min(max(rho, lo), hi)
                value, d = (capped, 0.0) if capped > unclipped else (unclipped, -a * rho)
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


@pytest.mark.parametrize(
    ("preset", "params"), CASES, ids=[f"{p}-{'-'.join(map(str, kw.values()))}" for p, kw in CASES]
)
@pytest.mark.parametrize("seed", range(3))
def test_matches_an_independent_implementation(preset, params, seed):
    pi, mu, prox, mask, rewards = random_batch(seed)
    algo = algorithms.build(preset, **params)
    adv = group_advantages(rewards, 4, algo.spec.std_normalize)
    assert 0.0 in adv, "the batch has A = 0 ties"
    expected_loss, expected_grad = reference(preset, params, pi, mu, prox, mask, adv)
    t = lambda rows: torch.tensor(rows, dtype=torch.float64)  # noqa: E731
    logp = t(pi).requires_grad_()
    loss, _ = algo.policy_loss(logp, t(mu), t(mask), t(adv), logp_prox=t(prox))
    loss.backward()
    assert float(loss.detach()) == pytest.approx(expected_loss, abs=1e-6)
    assert logp.grad.tolist() == [pytest.approx(row, abs=1e-6) for row in expected_grad]
    assert logp.grad.abs().sum() > 0


def test_m2po_selects_over_the_whole_batch_also_in_micro_batches():
    pi, mu, prox, mask, rewards = random_batch(7, groups=6)
    t = lambda rows: torch.tensor(rows, dtype=torch.float64)  # noqa: E731
    algo = algorithms.build("m2po")
    adv = algo.advantages(t(rewards), 4)
    whole = t(pi).requires_grad_()
    _, full_stats = algo.policy_loss(whole, t(mu), t(mask), adv)
    algo.policy_loss(whole, t(mu), t(mask), adv)[0].backward()
    selected = algo.selection(t(pi), t(mu), t(mask), adv)
    parts = t(pi).requires_grad_()
    n_tokens = float(t(mask).sum())
    for rows in (slice(0, 8), slice(8, 16), slice(16, 24)):
        loss, _ = algo.policy_loss(
            parts[rows], t(mu)[rows], t(mask)[rows], adv[rows], selected=selected[rows], total_tokens=n_tokens
        )
        loss.backward()
    assert torch.allclose(whole.grad, parts.grad, atol=1e-12)
    assert 0 < full_stats["correction/masked_frac"] < 1
    # Selecting within each micro-batch instead would not give the same mask.
    local = torch.cat(
        [algo.selection(t(pi)[r], t(mu)[r], t(mask)[r], adv[r]) for r in (slice(0, 8), slice(8, 24))]
    )
    assert not torch.equal(local, selected)


def test_diagnostics_of_the_ratio():
    _, _, stats = example("grpo-tis", ())
    ratios = sorted(r for row in RATIOS for r in row)
    assert stats["is_ratio/min"] == pytest.approx(0.3)
    assert stats["is_ratio/max"] == pytest.approx(3.5)
    assert stats["is_ratio/p50"] == pytest.approx(torch.tensor(ratios).double().quantile(0.5).item())
    assert stats["ess_frac"] == pytest.approx(sum(ratios) ** 2 / (8 * sum(r * r for r in ratios)))
    # TIS: the weight applied is π/π_prox · min(q, 2), and 0 where the clip takes the gradient
    # away (y1t2, y2t1, y2t2, y3t2), over every token (none is masked).
    flat = [(r, q) for rr, qq in zip(RATIOS, Q, strict=True) for r, q in zip(rr, qq, strict=True)]
    weights = [0.0 if i in (1, 2, 3, 5) else r / q * min(q, 2.0) for i, (r, q) in enumerate(flat)]
    assert stats["correction/weight_mean"] == pytest.approx(sum(weights) / 8)


@pytest.mark.parametrize(
    ("knob", "value", "rule"),
    [
        ("is_cap", 0.5, "is_cap must be >= 1"),
        ("m2po_tau", 0, "m2po_tau must be > 0"),
        ("sapo_tau_pos", -1, "sapo_tau_pos must be > 0"),
        ("dppo_delta", 1.0, "0 < dppo_delta < 1"),
        ("opsm_delta", 0, "0 < opsm_delta < 1"),
        ("is_low", 0, "0 < is_low <= 1"),
        ("anchor", "trainer", "anchor must be one of behaviour, proximal"),
        ("m2po_quadrants", "yes", "m2po_quadrants must be true or false"),
    ],
)
def test_knobs_out_of_range_name_the_rule(knob, value, rule):
    with pytest.raises(ValueError, match=rule):
        algorithms.build("grpo", **{knob: value})


@pytest.mark.parametrize(
    ("knob", "value", "message"),
    [
        ("eps_low", 0, "eps_low must satisfy 0 < eps_low <= 1 (got 0)"),
        ("eps_high", 0.0, "eps_high must be > 0 (got 0.0)"),
        ("eps_low_prime", 1.5, "eps_low_prime must satisfy 0 < eps_low_prime <= 1 (got 1.5)"),
        ("eps_high_prime", -1, "eps_high_prime must be > 0 (got -1)"),
        ("reg_coef", -0.1, "reg_coef must be >= 0 (got -0.1)"),
        ("temp", 0, "temp must be > 0 (got 0): RED-Weight divides the advantage by it"),
        ("std_normalize", 1, "std_normalize must be true or false (got 1)"),
        ("std", "n", "std must be one of sample, population (got 'n')"),
        (
            "loss_agg",
            "mean",
            "loss_agg must be one of token-mean, seq-mean-token-mean, seq-mean-token-sum, "
            "seq-mean-token-sum-norm (got 'mean')",
        ),
        ("dual_clip", 1, "dual_clip must be > 1 or null to disable it (got 1)"),
        ("anchor", None, "anchor must be one of behaviour, proximal (got None)"),
        ("is_cap", 0.5, "is_cap must be >= 1 (got 0.5): C caps the behaviour weight q, which is 1 on-policy"),
        ("is_low", 0, "is_low must satisfy 0 < is_low <= 1 (got 0)"),
        ("is_high", 0.9, "is_high must be >= 1 (got 0.9)"),
        ("m2po_tau", float("nan"), "m2po_tau must be > 0 (got nan)"),
        ("m2po_quadrants", None, "m2po_quadrants must be true or false (got None)"),
        ("sapo_tau_pos", "1", "sapo_tau_pos must be a number (got '1')"),
        ("sapo_tau_neg", True, "sapo_tau_neg must be a number (got True)"),
        (
            "dppo_delta",
            1,
            "dppo_delta must satisfy 0 < dppo_delta < 1 (got 1): it bounds a change of probability",
        ),
        (
            "opsm_delta",
            1.0,
            "opsm_delta must satisfy 0 < opsm_delta < 1, or be null to turn OPSM off (got 1.0)",
        ),
        ("temperature", 1, "unknown algorithm parameter 'temperature'; known: eps_low, eps_high,"),
    ],
)
def test_every_knob_says_its_whole_rule(knob, value, message):
    from rlcore.presets import check_param

    with pytest.raises(ValueError) as error:
        check_param(knob, value)
    assert str(error.value).startswith(message)


def test_knobs_within_their_rules_come_back_as_their_kind():
    from rlcore.presets import TUNABLE, check_param

    assert check_param("eps_low", 1) == 1.0 and isinstance(check_param("eps_low", 1), float)
    assert check_param("dual_clip", None) is None and check_param("opsm_delta", None) is None
    assert check_param("std", "population") == "population" and check_param("m2po_quadrants", True) is True
    assert TUNABLE[:3] == ("eps_low", "eps_high", "eps_low_prime") and TUNABLE[-1] == "opsm_delta"


def test_check_knobs_answers_a_sweeps_whole_question_at_once():
    from rlcore.presets import check_knobs

    found = check_knobs(
        ["grpo", "reinforce", "grpo", "no-such-preset"],
        {"eps_high": 0, "std_normalize": True, "temp": 2},
        {"std": ["sample", "bad"], "epsilon": [1], "eps_low": [0.1, 1.5]},
    )
    assert found.refused == {"eps_high": "eps_high must be > 0 (got 0)"}
    assert list(found.unknown) == ["epsilon"] and found.unknown["epsilon"].startswith(
        "unknown algorithm parameter 'epsilon'; known: eps_low,"
    )
    assert found.refused_values == {
        "std": [("bad", "std must be one of sample, population (got 'bad')")],
        "eps_low": [(1.5, "eps_low must satisfy 0 < eps_low <= 1 (got 1.5)")],
    }
    # Each preset once; std is read by both once std_normalize (a valid override) is applied.
    assert found.ignored == {
        "std_normalize": [],
        "temp": ["grpo", "reinforce"],
        "std": [],
        "eps_low": ["reinforce"],
    }


def test_every_preset_reads_its_own_knobs_and_names_its_source():
    from rlcore.presets import PRESETS, families

    assert PRESETS["m2po"].spec.knobs() == (
        "std_normalize",
        "std",
        "loss_agg",
        "anchor",
        "m2po_tau",
        "m2po_quadrants",
        "opsm_delta",
    )
    assert "is_cap" in PRESETS["decoupled-ppo"].spec.knobs()
    # The anchor is a knob wherever the loss reads a ratio; REINFORCE, RED and AsymRE read none.
    assert "anchor" in PRESETS["rec-oneside-nois"].spec.knobs() and "anchor" in PRESETS["opmd"].spec.knobs()
    assert not {"anchor"} & {
        k for p in ("reinforce", "red-drop", "red-weight", "asymre") for k in PRESETS[p].spec.knobs()
    }
    grouped = [name for names in families().values() for name in names]
    assert sorted(grouped) == sorted(PRESETS)
    for name in ("decoupled-ppo", "grpo-tis", "grpo-mis", "m2po", "cispo", "sapo", "gmpo", "topr", "dppo-tv"):
        assert "arXiv" in PRESETS[name].description or "verl" in PRESETS[name].description, name
