"""The field's staleness-robust losses (docs/algorithms.md §13, §16): every new preset against the
worked example, and against an independent implementation written here from the formulas (plain
Python floats, gradients by hand) on random batches with varied lengths, A = 0 ties and both
anchors."""

import math

import pytest
import torch

from rlcore import algorithms
from rlcore.sinks import BAPO_METRICS, MASKED_METRICS
from tests.rlcore.field_reference import (
    CASES,
    MU,
    RATIOS,
    REWARDS,
    Q,
    group_advantages,
    random_batch,
    reference,
)

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
    # §16 (the field since late 2025). TRM's share is the responses it dropped plus the clipped
    # tokens of those it kept.
    ("icepop", ()): ([-0.9526, 0, 0, 0, 1.7320, 0, -0.2598, -0.5196], -0.077942, "clip_frac", 0.5),
    ("kpop", ()): ([-0.9526, 0, 0, 0, 1.7320, 0, -0.2598, -0.5196], -0.043301, "clip_frac", 0.5),
    ("trm", ()): (
        [-0.9526, 0, 0, 0, 0, 0, -0.2598, -0.6495],
        -0.362648,
        "clip_frac+correction/masked_frac",
        0.625,
    ),
    ("dppo-kl", ()): (
        [-0.55, -0.75, 0.35, 1.75, 1.0, 0, -0.15, -0.30],
        0.089121,
        "correction/masked_frac",
        0.125,
    ),
    ("ce-gppo", ()): (
        [-0.9526, -1.0392, 0.3464, 3.0311, 1.7320, 0.3464, -0.2598, -0.5196],
        0.335584,
        "clip_frac",
        0.375,
    ),
    ("dro", ()): (
        [-0.4952, -0.4797, 0.4822, 0.5626, 0.5347, 0.4398, -0.5602, -0.5255],
        0.117176,
        "clip_frac",
        0,
    ),
    ("bapo", ()): (
        [-0.9526, -1.2990, 0, 3.0311, 1.7320, 0, -0.2598, -0.5196],
        0.411361,
        "clip_frac",
        0.25,
    ),
}
# Tokens each mask removed in the example: decoupled PPO's cap (q 6 > 5), MIS ([0.5, 5]: q 6 and 0.4),
# OPSM (y3, whose mean μ − π is 0.255 > 0.1).
MASKED = {"decoupled-ppo": 0.125, "grpo-mis": 0.25, "grpo": 0.25, "grpo-tis": 0, "dppo-tv": 0, "cispo": 0}
# §16: IcePop masks q 6 and 0.4; KPop only q 6 (p > 0 is no probability: the clamp makes its binary
# KL 13.8); TRM drops y2 and y3 (largest k3 3.21, 0.32 > 0.1); DPPO-KL y3t2 (binary KL 0.126).
MASKED.update(
    {"icepop": 0.25, "kpop": 0.125, "trm": 0.5, "dppo-kl": 0.125, "ce-gppo": 0, "dro": 0, "bapo": 0}
)


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
    assert sum(stats[name] for name in share_of.split("+")) == pytest.approx(share, abs=1e-4)
    if key[0] in MASKED:
        assert stats["correction/masked_frac"] == pytest.approx(MASKED[key[0]], abs=1e-9)


@pytest.mark.parametrize("preset", ["grpo-tis", "icepop", "kpop"])
def test_the_anchor_is_what_makes_tis_differ_from_grpo(preset):
    """Under a behaviour anchor q ≡ 1: grpo-tis, IcePop and KPop are GRPO exactly."""
    corrected, _, _ = example(preset, (("anchor", "behaviour"),))
    grpo, _, _ = example("grpo", ())
    assert torch.allclose(corrected, grpo, atol=1e-12)
    assert not torch.allclose(example(preset, ())[0], grpo, atol=1e-3)


def test_bapo_searches_its_bounds_as_the_authors_loop():
    """§16's example: s(0.6, 1.2) = 0.471 < 0.5; raising c_low only lowers s, so c_low goes to 0.9,
    then c_high to 3.0 without reaching 0.5 (s = 0.479)."""
    _, _, stats = example("bapo", ())
    assert (stats["bapo/c_low"], stats["bapo/c_high"]) == (0.9, 3.0)
    assert stats["bapo/s"] == pytest.approx(0.479452, abs=1e-6)
    algo = algorithms.build("bapo", bapo_low_end=0.6, bapo_high_end=1.2)  # no room to move
    _, _, stats = example("bapo", (("bapo_low_end", 0.6), ("bapo_high_end", 1.2)))
    assert stats["bapo/s"] == pytest.approx(3.2 / 6.8, abs=1e-6)
    # The target met at once: the bounds stay where they start.
    _, _, stats = example("bapo", (("bapo_target", 0.4),))
    assert (stats["bapo/c_low"], stats["bapo/c_high"]) == (0.6, 1.2)
    assert algo.bapo_grid() == ([0.6], [1.2])
    lows, highs = algorithms.build("bapo").bapo_grid()
    assert len(lows) == 7 and lows[-1] == 0.9 and len(highs) == 19 and highs[-1] == 3.0
    # Without negative tokens s is infinite and nothing moves.
    mu = torch.zeros(2, 2, dtype=torch.float64)
    _, stats = algorithms.build("bapo").policy_loss(mu - 0.1, mu, torch.ones(2, 2), torch.tensor([1.0, 0.0]))
    assert stats["bapo/s"] == math.inf and (stats["bapo/c_low"], stats["bapo/c_high"]) == (0.6, 1.2)


def test_bapo_searches_once_per_mini_batch_so_accumulation_is_exact():
    """Bounds searched over the whole mini-batch and held for its micro-batches give the whole
    mini-batch's gradient; searched per micro-batch (the authors' code) they would not."""
    pi, mu, prox, mask, rewards = random_batch(2, groups=6)
    t = lambda rows: torch.tensor(rows, dtype=torch.float64)  # noqa: E731
    algo = algorithms.build("bapo", bapo_target=0.9)
    adv = algo.advantages(t(rewards), 4)
    whole = t(pi).requires_grad_()
    algo.policy_loss(whole, t(mu), t(mask), adv)[0].backward()
    bounds = algo.search(t(pi), t(mu), t(mask), adv)
    parts = t(pi).requires_grad_()
    n_tokens = float(t(mask).sum())
    pieces = (slice(0, 8), slice(8, 16), slice(16, 24))
    for rows in pieces:
        loss, stats = algo.policy_loss(
            parts[rows], t(mu)[rows], t(mask)[rows], adv[rows], bounds=bounds, total_tokens=n_tokens
        )
        loss.backward()
        assert (stats["bapo/c_low"], stats["bapo/c_high"]) == bounds[:2]
    assert torch.allclose(whole.grad, parts.grad, atol=1e-12)
    local = [algo.search(t(pi)[r], t(mu)[r], t(mask)[r], adv[r]) for r in pieces]
    assert any(b[:2] != bounds[:2] for b in local), (bounds, local)
    assert algorithms.build("grpo").search(t(pi), t(mu), t(mask), adv) is None


@pytest.mark.parametrize("anchor", ["behaviour", "proximal"])
def test_dro_is_opmd_with_half_its_beta(anchor):
    pi, mu, prox, mask, rewards = random_batch(4)
    t = lambda rows: torch.tensor(rows, dtype=torch.float64)  # noqa: E731
    grads = []
    for preset, params in (("dro", {"dro_beta": 0.3}), ("opmd", {"reg_coef": 0.15})):
        algo = algorithms.build(preset, anchor=anchor, **params)
        logp = t(pi).requires_grad_()
        algo.policy_loss(logp, t(mu), t(mask), algo.advantages(t(rewards), 4), logp_prox=t(prox))[
            0
        ].backward()
        grads.append(logp.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-12)
    assert not torch.allclose(grads[0], example("reinforce", ())[0].new_zeros(1), atol=1e-3)


def test_proximal_anchor_needs_the_proximal_logprobs():
    algo = algorithms.build("decoupled-ppo")
    mu = torch.zeros(4, 2)
    with pytest.raises(ValueError, match="proximal"):
        algo.policy_loss(mu.clone(), mu, torch.ones(4, 2), torch.zeros(4))


# ----- an independent implementation, from the formulas ------------------------------------------


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
        ("anchor", "trainer", "anchor must be one of behaviour, proximal, loglinear"),
        ("m2po_quadrants", "yes", "m2po_quadrants must be true or false"),
        ("kpop_phi", 0, "kpop_phi must be > 0"),
        ("trm_delta", -0.1, "trm_delta must be > 0"),
        ("dppo_kl_delta", 0, "dppo_kl_delta must be > 0"),
        ("dppo_ratio_cap", 0.5, "dppo_ratio_cap must be >= 1"),
        ("cegppo_beta_low", -1, "cegppo_beta_low must be >= 0"),
        ("cegppo_beta_high", -0.5, "cegppo_beta_high must be >= 0"),
        ("dro_beta", -0.05, "dro_beta must be >= 0"),
        ("bapo_target", 0, "bapo_target must be > 0"),
        ("bapo_low_start", 1.5, "0 < bapo_low_start <= 1"),
        ("bapo_low_end", 0, "0 < bapo_low_end <= 1"),
        ("bapo_low_step", 0.001, "bapo_low_step must be >= 0.01"),
        ("bapo_high_start", 0.9, "bapo_high_start must be >= 1"),
        ("bapo_high_end", 0.5, "bapo_high_end must be >= 1"),
        ("bapo_high_step", 0, "bapo_high_step must be >= 0.01"),
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
        ("anchor", None, "anchor must be one of behaviour, proximal, loglinear (got None)"),
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
        (
            "dppo_ratio_cap",
            0.5,
            "dppo_ratio_cap must be >= 1 (got 0.5): C truncates the ratio, which is 1 on-policy",
        ),
        ("bapo_high_step", 0, "bapo_high_step must be >= 0.01 (got 0): the search tries each value in turn"),
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
    # §16: each names its source; grouped on its form (a proximal-anchored correction, or a surrogate).
    sources = {
        "icepop": "arXiv 2510.18855",
        "kpop": "ringtech.notion.site/kpop",
        "trm": "arXiv 2512.23075",
        "dppo-kl": "arXiv 2602.04879",
        "ce-gppo": "arXiv 2509.20712",
        "dro": "verl compute_policy_loss_dro",
        "bapo": "arXiv 2510.18927",
    }
    for name, source in sources.items():
        assert source in PRESETS[name].description, name
    assert {"icepop", "kpop", "trm"} <= set(families()["Behaviour corrections (proximal anchor)"])
    assert {"dppo-kl", "ce-gppo", "dro", "bapo"} <= set(families()["The field's staleness-robust losses"])
    assert "minpro" not in PRESETS  # provisional in §16: its paper could not be pinned
    assert PRESETS["bapo"].spec.knobs() == (
        "std_normalize",
        "std",
        "loss_agg",
        "anchor",
        "bapo_target",
        "bapo_low_start",
        "bapo_low_end",
        "bapo_low_step",
        "bapo_high_start",
        "bapo_high_end",
        "bapo_high_step",
        "opsm_delta",
    )
    assert "kpop_phi" in PRESETS["kpop"].spec.knobs() and "is_low" in PRESETS["icepop"].spec.knobs()
    assert "trm_delta" not in PRESETS["grpo"].spec.knobs()


# §7's masked-token counts on the worked example's 8 tokens, (staleness, mismatch, sequence, clip),
# read off §13/§16's notes above (MASKED) and the clip shares of TABLE: IcePop's mismatch mask takes
# q 6 and q 0.4 and its clip 4 tokens, KPop's only q 6; TRM drops y2 and y3 and clips one kept token;
# DPPO-KL's trust region takes y3t2, M2PO's selection all but y1t1; OPSM drops y3.
COUNTS = {
    ("icepop", ()): (0, 2, 0, 4),
    ("kpop", ()): (0, 1, 0, 4),
    ("decoupled-ppo", ()): (0, 1, 0, 4),
    ("trm", ()): (0, 0, 4, 1),
    ("dppo-kl", ()): (1, 0, 0, 0),
    ("m2po", ()): (7, 0, 0, 0),
    ("grpo", (("opsm_delta", 0.1),)): (0, 0, 2, 2),
}


@pytest.mark.parametrize("key", list(COUNTS), ids=lambda k: k[0] + "".join(f"+{n}" for n, _ in k[1]))
def test_masked_token_counts_by_mechanism_on_the_worked_example(key):
    algo = algorithms.build(key[0], **dict(key[1]))
    mu = torch.full((4, 2), MU, dtype=torch.float64)
    logp = mu + torch.tensor(RATIOS, dtype=torch.float64).log()
    prox = mu + torch.tensor(Q, dtype=torch.float64).log()
    adv = algo.advantages(torch.tensor(REWARDS, dtype=torch.float64), 4)
    mask = torch.ones(4, 2, dtype=torch.float64)
    _, stats = algo.policy_loss(logp, mu, mask, adv, logp_prox=prox, by_mechanism=True)
    assert tuple(stats[name] for name in MASKED_METRICS) == COUNTS[key]
    assert stats["masked_tokens/clip"] == pytest.approx(8 * stats["clip_frac"])
    _, without = algo.policy_loss(logp, mu, mask, adv, logp_prox=prox)
    assert not set(MASKED_METRICS) & set(without), "counted only where asked (once per step)"


def test_masked_token_counts_count_valid_tokens_only():
    """`grpo-mis` (PPO-clip on r = π/p, masked IS on q = p/μ ∈ [0.5, 5]) with OPSM (δ 0.1) on the
    example, y2t2 (q 6, clipped) padding. By hand: A_σ's signs +, −, −, +; OPSM's mean μ − π over
    valid tokens is −ln 0.7 = 0.357 for y2 (now one token) and −(ln 2 + ln 0.3)/2 = 0.255 for y3,
    both > 0.1 with A < 0, so both go (3 valid tokens); the mismatch mask takes y3t2 (q 0.4) only;
    the clip acts where A > 0 and r > 1.2 or A < 0 and r < 0.8 on the A OPSM left: y1t2
    (r = 1.5/1.2 = 1.25) alone."""
    mask = torch.ones(4, 2, dtype=torch.float64)
    mask[1, 1] = 0
    signs = [1, -1, -1, 1]
    drift = [
        -sum(math.log(RATIOS[i][j]) for j in range(2) if mask[i, j]) / float(mask[i].sum()) for i in range(4)
    ]
    dropped = [signs[i] < 0 and drift[i] > 0.1 for i in range(4)]
    valid = [(i, j) for i in range(4) for j in range(2) if mask[i, j]]
    sequence = sum(dropped[i] for i, _ in valid)
    mismatch = sum(not 0.5 <= Q[i][j] <= 5 for i, j in valid)
    r = {(i, j): RATIOS[i][j] / Q[i][j] for i, j in valid}
    clip = sum(
        not dropped[i] and ((signs[i] > 0 and r[i, j] > 1.2) or (signs[i] < 0 and r[i, j] < 0.8))
        for i, j in valid
    )
    assert (sequence, mismatch, clip) == (3, 1, 1)
    algo = algorithms.build("grpo-mis", opsm_delta=0.1)
    mu = torch.full((4, 2), MU, dtype=torch.float64)
    logp = mu + torch.tensor(RATIOS, dtype=torch.float64).log()
    prox = mu + torch.tensor(Q, dtype=torch.float64).log()
    adv = algo.advantages(torch.tensor(REWARDS, dtype=torch.float64), 4)
    _, stats = algo.policy_loss(logp, mu, mask, adv, logp_prox=prox, by_mechanism=True)
    assert tuple(stats[name] for name in MASKED_METRICS) == (0, mismatch, sequence, clip)


@pytest.mark.parametrize(
    "key",
    [*COUNTS, ("bapo", ()), ("rec-oneside-nois", ())],
    ids=lambda k: k[0] + "".join(f"+{n}" for n, _ in k[1]),
)
def test_a_loss_without_diagnostics_is_the_same_loss_with_its_clip_fraction_alone(key):
    """A micro-batch's loss takes no diagnostics (the step takes them once): the same loss, and of
    its statistics the clip fraction (BAPO: and its bounds) as the full statistics have it."""
    algo = algorithms.build(key[0], **dict(key[1]))
    mu = torch.full((4, 2), MU, dtype=torch.float64)
    logp = mu + torch.tensor(RATIOS, dtype=torch.float64).log()
    prox = mu + torch.tensor(Q, dtype=torch.float64).log()
    adv = algo.advantages(torch.tensor(REWARDS, dtype=torch.float64), 4)
    mask = torch.ones(4, 2, dtype=torch.float64)
    loss, stats = algo.policy_loss(logp, mu, mask, adv, logp_prox=prox, by_mechanism=True)
    lean_loss, lean = algo.policy_loss(logp, mu, mask, adv, logp_prox=prox, diagnostics=False)
    assert torch.equal(loss, lean_loss)
    assert lean == {name: stats[name] for name in ("clip_frac", *BAPO_METRICS) if name in stats}
    assert len(stats) > len(lean)


def test_m2po_second_moment_before_and_after_its_selection():
    """By hand on the example with y2t2 (ln 3.5)² padding: before, the mean of (ln ρ)² over the 7
    valid tokens; after, over those the selection kept, a mean ≤ τ."""
    mask = torch.ones(4, 2, dtype=torch.float64)
    mask[1, 1] = 0
    algo = algorithms.build("m2po")
    mu = torch.full((4, 2), MU, dtype=torch.float64)
    logp = mu + torch.tensor(RATIOS, dtype=torch.float64).log()
    adv = algo.advantages(torch.tensor(REWARDS, dtype=torch.float64), 4)
    selected = algo.selection(logp, mu, mask, adv)
    squares = {(i, j): math.log(RATIOS[i][j]) ** 2 for i in range(4) for j in range(2) if mask[i, j]}
    # Largest first until the mean of those left is ≤ 0.04.
    left = sorted(squares.values())
    while sum(left) / len(left) > 0.04:
        left.pop()
    kept = {key for key, value in squares.items() if selected[key] > 0}
    assert sorted(squares[key] for key in kept) == pytest.approx(left)
    moments = algorithms.second_moments(logp, mu, mask, selected)
    assert moments["m2po/m2_before"] == pytest.approx(sum(squares.values()) / 7, abs=1e-12)
    assert moments["m2po/m2_after"] == pytest.approx(sum(left) / len(left), abs=1e-12)
    assert moments["m2po/m2_after"] <= 0.04 < moments["m2po/m2_before"]
