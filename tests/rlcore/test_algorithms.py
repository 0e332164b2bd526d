"""Every preset against the worked example of docs/algorithms.md §8, plus the identities of §4/§5."""

import math

import pytest
import torch

from rlcore import algorithms

RATIOS = [[1.1, 1.5], [0.7, 3.5], [2.0, 0.3], [0.3, 0.6]]
REWARDS = [1.0, 0.0, 0.0, 1.0]
OLD = -1.5

# preset: (per-token gradient × 8, token-mean loss, clip_frac)
TABLE = {
    "reinforce": ([-0.5, -0.5, 0.5, 0.5, 0.5, 0.5, -0.5, -0.5], 0.099955, 0),
    "grpo": ([-0.9526, 0, 0, 3.0311, 1.7320, 0, -0.2598, -0.5196], 0.422187, 0.375),
    "rec-oneside-is": ([-0.55, 0, 0, 1.75, 1.0, 0, -0.15, -0.30], 0.067738, 0.375),
    "rec-oneside-nois": ([-0.5, 0, 0, 0.5, 0.5, 0, -0.5, -0.5], 0.316587, 0.375),
    "rec-oneside-nois-wide": ([-0.5, -0.5, 0.5, 0.5, 0.5, 0, -0.5, -0.5], 0.268954, 0.125),
    "rec-twoside-nois": ([-0.5, 0, 0, 0, 0, 0, 0, 0], 0.087793, 0.875),
    "rec-ring-nois": ([-0.5, 0, 0, 0.5, 0, 0, -0.5, 0], 0.241339, 0.625),
    "opmd": ([-0.4809, -0.4189, 0.4287, 0.7506, 0.6386, 0.2592, -0.7408, -0.6022], 0.168838, 0),
    "asymre": ([-0.6, -0.6, 0.4, 0.4, 0.4, 0.4, -0.6, -0.6], 0.260315, 0),
    "red-weight": ([-0.8244, -0.8244, 0.3033, 0.3033, 0.3033, 0.3033, -0.8244, -0.8244], 0.530525, 0),
    "gspo": ([0, 0, 1.3555, 1.3555, 0, 0, -0.3674, -0.3674], 0.246878, 0.5),
    "rec-gspo-is": ([0, 0, 0.7826, 0.7826, 0, 0, -0.2121, -0.2121], -0.080801, 0.5),
}


def example_batch():
    logp_old = torch.full((4, 2), OLD, dtype=torch.float64)
    logp = (logp_old + torch.tensor(RATIOS, dtype=torch.float64).log()).requires_grad_()
    mask = torch.ones(4, 2, dtype=torch.float64)
    return logp, logp_old, mask


def run(algo, rewards=REWARDS, generator=None):
    logp, logp_old, mask = example_batch()
    adv = algo.advantages(torch.tensor(rewards, dtype=torch.float64), 4, generator)
    loss, stats = algo.policy_loss(logp, logp_old, mask, adv, logp_prox=logp_old)
    loss.backward()
    return logp.grad.flatten() * 8, float(loss.detach()), stats, adv


@pytest.mark.parametrize("preset", list(TABLE))
def test_worked_example(preset):
    grad, loss, stats, _ = run(algorithms.build(preset))
    expected_grad, expected_loss, expected_clip = TABLE[preset]
    # seq-mean-token-mean divides by 4 seqs × 2 tokens = 8 too, so the ×8 scaling matches the table.
    assert grad.tolist() == pytest.approx(expected_grad, abs=1e-4)
    assert loss == pytest.approx(expected_loss, abs=1e-4)
    assert stats["clip_frac"] == pytest.approx(expected_clip, abs=1e-4)


def test_kl_behavior_of_the_example():
    _, _, stats, _ = run(algorithms.build("reinforce"))
    assert stats["kl/behavior"] == pytest.approx(0.103595, abs=1e-5)
    assert stats["is_ratio/max"] == pytest.approx(3.5)


def test_grpo_advantages_are_sigma_normalised():
    adv = algorithms.build("grpo").advantages(torch.tensor(REWARDS, dtype=torch.float64), 4)
    assert adv.tolist() == pytest.approx([0.866024, -0.866024, -0.866024, 0.866024], abs=1e-6)
    population = algorithms.build("grpo", std="population").advantages(
        torch.tensor(REWARDS, dtype=torch.float64), 4
    )
    assert population.tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)


def test_a_group_of_one_uses_mean_zero_std_one():
    adv = algorithms.build("grpo").advantages(torch.tensor([0.3, 2.0]), 1)
    assert adv.tolist() == pytest.approx([0.3, 2.0], abs=1e-5)


def test_red_drop_worked_example():
    algo = algorithms.build("red-drop")
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    # Find a seed whose random choice drops y3 and y4, as in the spec's example.
    for seed in range(100):
        adv, keep = algo.advantages_and_keep(rewards, 4, torch.Generator().manual_seed(seed))
        if keep.tolist() == [True, True, False, False]:
            break
    else:
        pytest.fail("no seed dropped exactly y3 and y4")
    assert adv.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0])
    assert 1 - keep.double().mean() == pytest.approx(0.5)
    logp, logp_old, mask = example_batch()
    loss, _ = algo.policy_loss(logp, logp_old, mask, adv)
    assert float(loss.detach()) == pytest.approx(0.024707, abs=1e-5)


def test_red_drop_balances_every_group_on_random_rewards():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 3, (64 * 8,), generator=gen).double()
    algo = algorithms.build("red-drop")
    adv, keep = algo.advantages_and_keep(rewards, 8, torch.Generator().manual_seed(1))
    for g, k, a in zip(rewards.view(-1, 8), keep.view(-1, 8), adv.view(-1, 8), strict=True):
        positive = g >= g.mean()
        n_pos, n_neg = int(positive.sum()), int((~positive).sum())
        assert int((~k).sum()) == max(0, n_neg - n_pos)
        assert bool(k[positive].all()), "only negatives are dropped"
        assert float(a[k].sum()) == pytest.approx(0.0, abs=1e-9)
        assert bool((a[~k] == 0).all())


def test_red_drop_is_seeded():
    rewards = torch.tensor([1.0] + [0.0] * 7)
    algo = algorithms.build("red-drop")
    a = algo.advantages_and_keep(rewards, 8, torch.Generator().manual_seed(5))[1]
    b = algo.advantages_and_keep(rewards, 8, torch.Generator().manual_seed(5))[1]
    assert torch.equal(a, b)


@pytest.mark.parametrize("seed", range(5))
def test_grpo_and_rec_oneside_is_have_identical_gradients(seed):
    gen = torch.Generator().manual_seed(seed)
    n, t = 16, 7
    logp_old = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 3
    log_ratio = (torch.rand(n, t, generator=gen, dtype=torch.float64) - 0.5) * 1.5
    mask = (torch.rand(n, t, generator=gen) > 0.2).double()
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    grads = []
    for name in ("grpo", "rec-oneside-is"):
        logp = (logp_old + log_ratio).requires_grad_()
        loss, _ = algorithms.build(name).policy_loss(logp, logp_old, mask, adv)
        loss.backward()
        grads.append(logp.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-12)
    assert grads[0].abs().sum() > 0


def test_dual_clip_caps_negative_advantage_tokens():
    logp, logp_old, mask = example_batch()
    adv = torch.tensor([0.5, -0.5, -0.5, 0.5], dtype=torch.float64)
    loss, stats = algorithms.build("grpo", dual_clip=3.0).policy_loss(logp, logp_old, mask, adv)
    loss.backward()
    # y2t2 has ρ = 3.5 > 3 with A < 0: the dual clip removes its gradient and counts it as clipped.
    assert float(logp.grad[1, 1]) == 0.0
    assert stats["clip_frac"] == pytest.approx(0.5)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batches_accumulate_to_the_full_batch_gradient(agg):
    gen = torch.Generator().manual_seed(3)
    n, t = 12, 5
    logp_old = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 2
    base = logp_old + (torch.rand(n, t, generator=gen, dtype=torch.float64) - 0.5)
    mask = (torch.rand(n, t, generator=gen) > 0.3).double()
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    algo = algorithms.build("rec-oneside-nois", loss_agg=agg)
    full = base.clone().requires_grad_()
    algo.policy_loss(full, logp_old, mask, adv)[0].backward()
    part = base.clone().requires_grad_()
    for sl in (slice(0, 5), slice(5, 12)):
        loss, _ = algo.policy_loss(
            part[sl], logp_old[sl], mask[sl], adv[sl], total_tokens=float(mask.sum()), total_seqs=n
        )
        loss.backward()
    assert torch.allclose(full.grad, part.grad, atol=1e-12)


def test_unknown_preset_and_parameters_name_the_problem():
    with pytest.raises(ValueError, match="unknown algorithm preset 'ppo2'"):
        algorithms.build("ppo2")
    with pytest.raises(ValueError, match="unknown algorithm parameter 'epsilon'"):
        algorithms.build("grpo", epsilon=0.2)
    with pytest.raises(ValueError, match="eps_low must satisfy 0 < eps_low <= 1"):
        algorithms.build("grpo", eps_low=1.5)
    with pytest.raises(ValueError, match="temp must be > 0"):
        algorithms.build("red-weight", temp=0)
    with pytest.raises(ValueError, match="reg_coef must be >= 0"):
        algorithms.build("opmd", reg_coef=-0.1)


def test_every_preset_is_listed_and_builds():
    names = algorithms.presets()
    assert set(TABLE) <= set(names)
    assert {"rec-twoside-is", "rec-ring-is", "red-drop", "rec-gspo-nois"} <= set(names)
    for name in names:
        algo = algorithms.build(name)
        grad, loss, stats, _ = run(algo)
        assert math.isfinite(loss) and 0 <= stats["clip_frac"] <= 1


def test_every_name_of_the_family_has_its_function_in_one_table():
    from typing import get_args

    from rlcore import presets

    tables = {
        "surrogate": (algorithms.SURROGATES, presets.Surrogate),
        "clip": (algorithms.CLIPS, presets.Clip),
        "weight": (algorithms.WEIGHTS, presets.Weight),
        "correction": (algorithms.CORRECTIONS, presets.Correction),
        "reg": (algorithms.REGULARISERS, presets.Reg),
        "loss_agg": (algorithms.AGGREGATIONS, presets.LossAgg),
    }
    for part, (table, names) in tables.items():
        assert sorted(table) == sorted(get_args(names)), part
    for part, reads in presets.READS.items():
        assert set(reads) <= set(tables[part][0]), part
    spec = presets.AlgorithmSpec(surrogate="ppo", loss_agg="no-such-mean")
    with pytest.raises(ValueError, match="unknown loss_agg 'no-such-mean'"):
        run(algorithms.Algorithm(name="x", spec=spec))
