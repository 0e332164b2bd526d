"""Rollout engines: behaviour log-probs recorded at rollout time match the trainer's."""

from types import SimpleNamespace

import pytest
import torch

from rlcore import models, tasks
from rlcore.batch import group_rngs
from rlcore.rollout import (
    HFEngine,
    rollout_from_vllm,
    sample_next,
    score_responses,
    token_logprobs,
    vllm_weight_names,
)


def rngs(seed, prompts):
    """One generator per prompt group, as the producer makes them."""
    return group_rngs(seed, 0, "test", range(len(prompts)))


@pytest.fixture(scope="module")
def tiny(small_config, cache_dir):
    config = small_config()
    task = tasks.build(config.task)
    return models.load(config, torch.device("cpu"), cache_dir, task), task


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_on_policy_rollout_and_trainer_log_probs_agree(tiny, temperature):
    lm, _ = tiny
    # Prompts of different lengths exercise left padding and position ids.
    prompts = lm.encode(["12+34=", "5+6=", "123+4567=", "99+1="] * 4)
    engine = HFEngine(lm.model, lm.eos_id, lm.pad_id)
    rollout = engine.generate(prompts, 6, temperature, 1.0, rngs(0, prompts))
    with torch.no_grad():
        logp, _ = token_logprobs(score_responses(lm.model, rollout), rollout.response_ids, temperature)
    mask = rollout.response_mask.bool()
    assert mask.sum() > 16
    assert (rollout.logp[mask] - logp[mask]).abs().max() < 1e-5
    assert bool((rollout.logp[~mask] == 0).all())


def test_responses_stop_at_eos_and_are_masked_after_it(tiny):
    lm, _ = tiny
    engine = HFEngine(lm.model, lm.eos_id, lm.pad_id)
    prompts = lm.encode(["12+34="] * 32)
    rollout = engine.generate(prompts, 6, 1.0, 1.0, rngs(1, prompts))
    for ids, mask, finished in zip(
        rollout.response_ids, rollout.response_mask, rollout.finished, strict=True
    ):
        length = int(mask.sum())
        assert bool((mask[:length] == 1).all()) and bool((mask[length:] == 0).all())
        eos_at = (ids == lm.eos_id).nonzero().flatten().tolist()
        if finished:
            assert eos_at[0] == length - 1, "EOS is the last response token and is in the mask"
        else:
            assert length == 6 and not eos_at
        assert bool((ids[length:] == lm.pad_id).all())


def test_sampling_depends_only_on_the_generator_seed(tiny):
    lm, _ = tiny
    engine = HFEngine(lm.model, lm.eos_id, lm.pad_id)
    prompts = lm.encode(["12+34=", "56+78="] * 8)
    a = engine.generate(prompts, 6, 1.0, 1.0, rngs(7, prompts))
    b = engine.generate(prompts, 6, 1.0, 1.0, rngs(7, prompts))
    c = engine.generate(prompts, 6, 1.0, 1.0, rngs(8, prompts))
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logp, b.logp)
    assert not torch.equal(a.response_ids, c.response_ids)


def test_a_groups_samples_do_not_depend_on_the_other_groups_in_the_batch(tiny):
    lm, _ = tiny
    engine = HFEngine(lm.model, lm.eos_id, lm.pad_id)
    prompts = lm.encode(["12+34=", "5+6=", "123+4567=", "99+1="])
    generators = group_rngs(3, 1, "sampling", range(4))
    whole = engine.generate(prompts, 6, 1.0, 1.0, generators, group_size=4)
    # Groups 2 and 3 alone (a different padding width, fewer rows), with their own generators.
    part = engine.generate(prompts[2:], 6, 1.0, 1.0, group_rngs(3, 1, "sampling", range(2, 4)), group_size=4)
    assert torch.equal(whole.response_ids[8:], part.response_ids)
    assert torch.equal(whole.response_mask[8:], part.response_mask)
    assert (whole.logp[8:] - part.logp).abs().max() < 1e-5
    other = engine.generate(prompts[2:], 6, 1.0, 1.0, group_rngs(4, 1, "sampling", range(2, 4)), group_size=4)
    assert not torch.equal(other.response_ids, part.response_ids), "another seed, other samples"


def test_sync_copies_the_policy_weights(tiny):
    lm, _ = tiny
    engine = HFEngine(lm.model, lm.eos_id, lm.pad_id)
    moved = [p.detach() + 0.01 for p in lm.model.parameters()]
    policy = type(lm.model)(lm.model.config)
    with torch.no_grad():
        for p, value in zip(policy.parameters(), moved, strict=True):
            p.copy_(value)
    engine.sync(policy)
    for mine, value in zip(engine.model.parameters(), moved, strict=True):
        assert torch.equal(mine, value)


def test_sampler_matches_the_tempered_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(20000, 1)
    tokens, logp = sample_next(logits, 0.5, 1.0, [torch.Generator().manual_seed(0)], logits.shape[0])
    expected = torch.softmax(logits[0] / 0.5, dim=-1)
    freq = torch.bincount(tokens, minlength=4).float() / tokens.numel()
    assert torch.allclose(freq, expected, atol=0.01)
    assert torch.allclose(logp, expected.log()[tokens], atol=1e-6)


def test_top_p_draws_only_from_the_nucleus_but_reports_tempered_log_probs():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()[None].repeat(5000, 1)
    tokens, logp = sample_next(logits, 1.0, 0.7, [torch.Generator().manual_seed(0)], logits.shape[0])
    assert set(tokens.tolist()) == {0, 1}
    assert torch.allclose(logp, probs.log()[tokens], atol=1e-6)


def test_greedy_picks_the_argmax():
    logits = torch.tensor([[0.1, 3.0, 0.2], [5.0, 0.0, 0.0]])
    tokens, _ = sample_next(logits, 1.0, 1.0, None)
    assert tokens.tolist() == [1, 0]


def _vllm_output(tokens, logps):
    entries = [{t: SimpleNamespace(logprob=lp, rank=1)} for t, lp in zip(tokens, logps, strict=True)]
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=tokens, logprobs=entries)])


def test_vllm_outputs_pack_into_a_rollout():
    eos, pad = 2, 0
    outputs = [
        _vllm_output([7, 8, eos], [-0.1, -0.2, -0.3]),
        _vllm_output([9, 9, 9, 9], [-1.0, -1.1, -1.2, -1.3]),
    ]
    rollout = rollout_from_vllm(outputs, [[1, 5, 6], [1, 5]], 4, eos, pad)
    assert rollout.prompt_ids.tolist() == [[1, 5, 6], [0, 1, 5]]
    assert rollout.prompt_mask.tolist() == [[1, 1, 1], [0, 1, 1]]
    assert rollout.response_ids.tolist() == [[7, 8, eos, pad], [9, 9, 9, 9]]
    assert rollout.response_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert rollout.logp.flatten().tolist() == pytest.approx([-0.1, -0.2, -0.3, 0.0, -1.0, -1.1, -1.2, -1.3])
    assert rollout.finished.tolist() == [True, False]


def test_vllm_outputs_without_logprobs_are_refused():
    output = SimpleNamespace(outputs=[SimpleNamespace(token_ids=[3], logprobs=None)])
    with pytest.raises(ValueError, match="logprobs=0"):
        rollout_from_vllm([output], [[1]], 4, 2, 0)


def test_vllm_weight_names_strip_wrappers_and_skip_tied_head():
    w = torch.zeros(1)
    named = [
        ("_orig_mod.model.embed_tokens.weight", w),
        ("module.model.layers.0.mlp.up_proj.weight", w),
        ("lm_head.weight", w),
    ]
    assert [n for n, _ in vllm_weight_names(named, tied_embeddings=True)] == [
        "model.embed_tokens.weight",
        "model.layers.0.mlp.up_proj.weight",
    ]
    assert "lm_head.weight" in [n for n, _ in vllm_weight_names(named, tied_embeddings=False)]


def test_groups_share_the_prompt_pass_without_changing_log_probs_or_gradients(tiny):
    lm, _ = tiny
    engine = HFEngine(lm.model, lm.eos_id, lm.pad_id)
    prompts = lm.encode(["12+34=", "5+6=", "123+4567=", "99+1="])
    rollout = engine.generate(prompts, 6, 1.0, 1.0, rngs(2, prompts), group_size=4).trimmed()
    assert torch.equal(rollout.prompt_ids[:4], rollout.prompt_ids[:1].repeat(4, 1))
    mask = rollout.response_mask.bool()
    grads, logps = [], []
    for group_size in (1, 4):
        lm.model.zero_grad(set_to_none=True)
        logp, _ = token_logprobs(score_responses(lm.model, rollout, group_size), rollout.response_ids, 1.0)
        (logp * rollout.response_mask).sum().backward()
        logps.append(logp.detach())
        grads.append(torch.cat([p.grad.flatten() for p in lm.model.parameters()]))
    lm.model.zero_grad(set_to_none=True)
    assert (logps[0][mask] - logps[1][mask]).abs().max() < 1e-5
    assert (rollout.logp[mask] - logps[1][mask]).abs().max() < 1e-5
    # Summing in another order moves a float32 gradient by about eps × the magnitude of what is
    # summed (entries here reach ~200), so compare the whole vectors: a wrong grouping is off by O(1).
    assert (grads[0] - grads[1]).norm() / grads[1].norm() < 1e-5


def test_shared_prompt_pass_refuses_rows_that_are_not_groups(tiny):
    lm, _ = tiny
    engine = HFEngine(lm.model, lm.eos_id, lm.pad_id)
    prompts = lm.encode(["12+34=", "5+6="])
    rollout = engine.generate(prompts, 6, 1.0, 1.0, rngs(0, prompts))
    with pytest.raises(ValueError, match="sharing a prompt"):
        score_responses(lm.model, rollout, 2)
