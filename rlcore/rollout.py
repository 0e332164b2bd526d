"""Rollout engines (`HFEngine`: a transformers model with a lean KV-cache decode loop; `VLLMEngine`,
`gpu` extra): generate responses and record their behaviour log-probs, `log_softmax(logits / T)`,
at rollout time. `score_responses` is the trainer's side of the same computation, so on-policy the
two agree to float error. Sampling randomness is one generator per prompt group."""

from __future__ import annotations

import copy
import inspect
import os
import socket
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor


@dataclass
class Rollout:
    """A batch of N responses. Prompts are left-padded, responses right-padded to T."""

    prompt_ids: Tensor  # [N, P] long
    prompt_mask: Tensor  # [N, P] long, 1 on prompt tokens
    response_ids: Tensor  # [N, T] long
    response_mask: Tensor  # [N, T] float, 1 on response tokens (up to and including EOS)
    logp: Tensor  # [N, T] float32 behaviour log-probs, 0 on padding
    finished: Tensor  # [N] bool, True when the response ended with EOS

    def to(self, device: torch.device | str) -> Rollout:
        return Rollout(*(t.to(device) for t in self.__dict__.values()))

    def clone(self) -> Rollout:
        """Ordinary tensors (usable by autograd) from ones made under inference mode."""
        return Rollout(*(t.clone() for t in self.__dict__.values()))

    def rows(self, index: slice) -> Rollout:
        return Rollout(*(t[index] for t in self.__dict__.values()))

    def trimmed(self) -> Rollout:
        """The same rollout with response columns cut to its longest response."""
        longest = max(1, int(self.response_mask.sum(dim=1).max()))
        return Rollout(
            self.prompt_ids,
            self.prompt_mask,
            self.response_ids[:, :longest],
            self.response_mask[:, :longest],
            self.logp[:, :longest],
            self.finished,
        )


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """([N, P] ids, [N, P] mask) with every prompt right-aligned."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


def sample_next(
    logits: Tensor,
    temperature: float,
    top_p: float,
    generators: Sequence[torch.Generator] | None,
    group_size: int = 1,
) -> tuple[Tensor, Tensor]:
    """Draw one token per row ([B, V] logits); greedy when `generators` is None.

    Rows come in groups of `group_size`; group g draws its uniforms from `generators[g]`.
    Returns (tokens [B], log-probs [B] of the tempered distribution).
    """
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    if generators is None:
        tokens = logits.argmax(dim=-1)
    else:
        probs = logp_all.exp()
        if top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p
            probs = probs.scatter(-1, order, sorted_probs.masked_fill(outside, 0.0))
        cdf = probs.cumsum(dim=-1)
        u = torch.cat([torch.rand((group_size, 1), generator=g) for g in generators]).to(cdf.device)
        tokens = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp(max=logits.shape[-1] - 1)
        tokens = tokens.squeeze(-1)
    return tokens, logp_all.gather(-1, tokens[:, None]).squeeze(-1)


class RolloutEngine(Protocol):
    """Generates with behaviour weights it holds; the trainer's weights reach it only through `sync`."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        generators: Sequence[torch.Generator] | None = None,
        group_size: int = 1,
    ) -> Rollout:
        """`group_size` responses per prompt, in consecutive rows, the group of prompt i sampled
        with `generators[i]`; greedy when `generators` is None."""

    def sync(self, policy: torch.nn.Module) -> None:
        """Load the trainer's current weights as the behaviour weights."""

    def rescore(self, rollout: Rollout, temperature: float, group_size: int = 1) -> Tensor:
        """[N, T] log-probs of the responses under the behaviour weights in the trainer's precision."""

    def snapshot(self) -> dict[str, Tensor]:
        """A copy of the behaviour weights (for a checkpoint, or to publish)."""

    def load_snapshot(self, weights: dict[str, Tensor]) -> None:
        """Load behaviour weights from a snapshot."""


class HFEngine:
    """Generates with a private copy of the model: the behaviour weights. With a `dtype` other
    than the model's it keeps them twice, as synced (for `rescore`) and cast to `dtype` (what
    it generates with, and reports the behaviour log-probs from): the training–inference
    mismatch of docs/algorithms.md §14, on any device torch runs that precision on."""

    def __init__(self, model: torch.nn.Module, eos_id: int, pad_id: int, dtype: torch.dtype | None = None):
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        self.eos_id = eos_id
        self.pad_id = pad_id
        cast = dtype is not None and dtype != next(self.model.parameters()).dtype
        self.generator = copy.deepcopy(self.model).to(dtype) if cast else self.model

    def sync(self, policy: torch.nn.Module) -> None:
        with torch.no_grad():
            torch._foreach_copy_(list(self.model.parameters()), list(policy.parameters()))
        self._cast()

    def snapshot(self) -> dict[str, Tensor]:
        """The behaviour weights as synced, for a checkpoint."""
        return {name: t.detach().clone() for name, t in self.model.state_dict().items()}

    def load_snapshot(self, weights: dict[str, Tensor]) -> None:
        """Copy a snapshot or published weights in: one fused copy when they name every tensor of
        the state dict with its shape and dtype (what `load_state_dict` would copy, without its
        per-module walk), else `load_state_dict`, which says what does not match."""
        targets = self.model.state_dict()
        if targets.keys() == weights.keys() and all(
            weights[name].shape == t.shape and weights[name].dtype == t.dtype for name, t in targets.items()
        ):
            with torch.no_grad():
                torch._foreach_copy_(list(targets.values()), [weights[name] for name in targets])
        else:
            self.model.load_state_dict(weights)
        self._cast()

    def _cast(self) -> None:
        if self.generator is not self.model:
            with torch.no_grad():
                torch._foreach_copy_(list(self.generator.parameters()), list(self.model.parameters()))

    def rescore(self, rollout: Rollout, temperature: float, group_size: int = 1) -> Tensor:
        """[N, T] log-probs of the rollout's responses under the same weights in the trainer's
        precision, computed as the trainer does (0 on padding)."""
        return rescore(self.model, rollout, temperature, group_size)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        generators: Sequence[torch.Generator] | None = None,
        group_size: int = 1,
    ) -> Rollout:
        with torch.inference_mode():
            rollout = decode(
                self.generator,
                prompts,
                max_new_tokens,
                temperature,
                top_p,
                generators,
                self.eos_id,
                self.pad_id,
                group_size,
            )
        return rollout.clone()


def _cache_argument(model: torch.nn.Module) -> str:
    """transformers renamed `past_key_values` to `cache` (5.2x); accept both."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def new_kv_cache(model: torch.nn.Module) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def _prefill(
    model: torch.nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, group_size: int
) -> tuple[Tensor, Any, Tensor]:
    """Run each prompt once; return (next-token logits [N, V], KV cache, next positions [N, 1])
    with every prompt's entries repeated for the `group_size` consecutive rows of its group."""
    cache = new_kv_cache(model)
    positions = (prompt_mask.cumsum(dim=1) - 1).clamp(min=0)
    out = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
        **{_cache_argument(model): cache},
    )
    logits = out.logits[:, -1, :]
    if group_size > 1:
        cache.batch_repeat_interleave(group_size)
        logits = logits.repeat_interleave(group_size, dim=0)
    return logits, cache, positions[:, -1:].repeat_interleave(group_size, dim=0) + 1


def decode(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    generators: Sequence[torch.Generator] | None,
    eos_id: int,
    pad_id: int,
    group_size: int = 1,
) -> Rollout:
    """Sample (or, without generators, greedily pick) up to `max_new_tokens` per response.

    Each prompt gets `group_size` responses in consecutive rows, sampled with its own
    generator (`generators[i]` for prompt i); its prompt runs once and the group shares its
    KV cache.
    """
    if generators is not None and len(generators) != len(prompts):
        raise ValueError(f"{len(generators)} generators for {len(prompts)} prompt groups")
    device = next(model.parameters()).device
    unique_ids, unique_mask = left_pad(prompts, pad_id)
    logits, cache, next_position = _prefill(model, unique_ids.to(device), unique_mask.to(device), group_size)
    prompt_ids = unique_ids.repeat_interleave(group_size, dim=0)
    prompt_mask = unique_mask.repeat_interleave(group_size, dim=0)
    n, width = prompt_ids.shape
    attention = torch.ones((n, width + max_new_tokens), dtype=torch.long, device=device)
    attention[:, :width] = prompt_mask
    response = torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logp = torch.zeros((n, max_new_tokens), dtype=torch.float32, device=device)
    alive = torch.ones(n, dtype=torch.bool, device=device)
    lengths = torch.zeros(n, dtype=torch.long, device=device)
    cache_kw = {_cache_argument(model): cache}
    for i in range(max_new_tokens):
        tokens, token_logp = sample_next(logits, temperature, top_p, generators, group_size)
        response[:, i] = torch.where(alive, tokens, pad_id)
        logp[:, i] = torch.where(alive, token_logp, 0.0)
        lengths += alive.long()
        alive &= tokens != eos_id
        if not alive.any() or i == max_new_tokens - 1:
            break
        out = model(
            input_ids=tokens[:, None],
            attention_mask=attention[:, : width + i + 1],
            position_ids=next_position + i,
            use_cache=True,
            logits_to_keep=1,
            **cache_kw,
        )
        logits = out.logits[:, -1, :]
    steps = torch.arange(max_new_tokens, device=device)[None, :]
    response_mask = (steps < lengths[:, None]).float()
    return Rollout(prompt_ids, prompt_mask, response.cpu(), response_mask.cpu(), logp.cpu(), (~alive).cpu())


def score_responses(model: torch.nn.Module, rollout: Rollout, group_size: int = 1) -> Tensor:
    """Logits [N, T, V] (float32) predicting each response token.

    With `group_size` > 1 the rows come in consecutive groups sharing one prompt (as the
    rollout made them): each prompt runs once and its KV cache, gradient included, is
    shared by the group's responses.
    """
    n, t = rollout.response_ids.shape
    if group_size == 1:
        ids = torch.cat([rollout.prompt_ids, rollout.response_ids], dim=1)
        attention = torch.cat([rollout.prompt_mask, rollout.response_mask.long()], dim=1)
        positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=t + 1)
        return out.logits[:, :-1, :].float()
    if n % group_size:
        raise ValueError(f"{n} rows do not split into groups of {group_size}")
    prompt_ids, prompt_mask = rollout.prompt_ids[::group_size], rollout.prompt_mask[::group_size]
    if not torch.equal(prompt_ids.repeat_interleave(group_size, dim=0), rollout.prompt_ids):
        raise ValueError(f"rows do not come in groups of {group_size} sharing a prompt")
    first, cache, next_position = _prefill(model, prompt_ids, prompt_mask, group_size)
    if t == 1:
        return first[:, None, :].float()
    attention = torch.cat([rollout.prompt_mask, rollout.response_mask[:, :-1].long()], dim=1)
    positions = next_position + torch.arange(t - 1, device=next_position.device)[None, :]
    rest = model(
        input_ids=rollout.response_ids[:, :-1],
        attention_mask=attention,
        position_ids=positions,
        use_cache=True,
        **{_cache_argument(model): cache},
    ).logits
    return torch.cat([first[:, None, :], rest], dim=1).float()


def rescore(model: torch.nn.Module, rollout: Rollout, temperature: float, group_size: int = 1) -> Tensor:
    """[N, T] log-probs of the rollout's responses under `model`, as the trainer computes them (on
    the model's device, returned on the CPU; 0 on padding)."""
    with torch.inference_mode():
        part = rollout.to(next(model.parameters()).device)
        logp, _ = token_logprobs(score_responses(model, part, group_size), part.response_ids, temperature)
        return (logp * part.response_mask).cpu().clone()


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """(log-probs [N, T] of `tokens`, full log-softmax [N, T, V]) of the tempered distribution."""
    logp_all = torch.log_softmax(logits / temperature, dim=-1)
    return logp_all.gather(-1, tokens[..., None]).squeeze(-1), logp_all


# ----- vLLM (optional `gpu` extra) -------------------------------------------------------------

_WRAPPER_PREFIXES = ("_orig_mod.", "module.", "_checkpoint_wrapped_module.")


def vllm_weight_names(
    named: Iterable[tuple[str, Tensor]], tied_embeddings: bool
) -> Iterator[tuple[str, Tensor]]:
    """The trainer's parameters under the names vLLM's `load_weights` expects.

    Strips wrapper prefixes (torch.compile, DDP, activation checkpointing) and leaves out
    `lm_head.weight` when embeddings are tied (vLLM shares the tensor itself).
    """
    for name, tensor in named:
        for prefix in _WRAPPER_PREFIXES:
            name = name.replace(prefix, "")
        if tied_embeddings and name == "lm_head.weight":
            continue
        yield name, tensor.detach()


def rollout_from_vllm(
    outputs: Sequence[Any], prompts: Sequence[Sequence[int]], max_new_tokens: int, eos_id: int, pad_id: int
) -> Rollout:
    """Pack vLLM `RequestOutput`s (one completion each, logprobs=0) into a `Rollout`.

    Each completion's `logprobs[i]` maps token id → object with `.logprob`; the sampled
    token's entry is the behaviour log-prob.
    """
    if len(outputs) != len(prompts):
        raise ValueError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
    prompt_ids, prompt_mask = left_pad(prompts, pad_id)
    n = len(prompts)
    response = torch.full((n, max_new_tokens), pad_id, dtype=torch.long)
    logp = torch.zeros((n, max_new_tokens), dtype=torch.float32)
    mask = torch.zeros((n, max_new_tokens), dtype=torch.float32)
    finished = torch.zeros(n, dtype=torch.bool)
    for row, request in enumerate(outputs):
        completion = request.outputs[0]
        tokens = list(completion.token_ids)[:max_new_tokens]
        if completion.logprobs is None:
            raise ValueError("vLLM returned no logprobs: request them with SamplingParams(logprobs=0)")
        for i, token in enumerate(tokens):
            response[row, i] = token
            logp[row, i] = float(completion.logprobs[i][token].logprob)
            mask[row, i] = 1.0
        finished[row] = bool(tokens) and tokens[-1] == eos_id
    return Rollout(prompt_ids, prompt_mask, response, mask, logp, finished)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMEngine:
    """vLLM in this process (external launcher), its weights synced from the trainer."""

    def __init__(
        self,
        model_path: str,
        dtype: str,
        eos_id: int,
        pad_id: int,
        seed: int,
        max_model_len: int,
        tied_embeddings: bool = False,
        scorer: torch.nn.Module | None = None,
    ):
        try:
            from vllm import LLM
        except ImportError as exc:
            raise RuntimeError("rollout.engine 'vllm' needs the gpu extra: pip install '.[gpu]'") from exc
        for key, value in {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
        }.items():
            os.environ.setdefault(key, value)
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        self.llm = LLM(
            model=model_path,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            gpu_memory_utilization=float(os.environ.get("LAB_VLLM_GPU_MEMORY", "0.3")),
            distributed_executor_backend="external_launcher",
            # Log-probs of the tempered sampling distribution, as the trainer computes them.
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=False,
        )
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.tied_embeddings = tied_embeddings
        self._weights: dict[str, Tensor] = {}
        # The trainer's model class in the trainer's precision, holding the pushed weights too:
        # `rescore` runs the trainer's computation on what vLLM generated.
        self.scorer = None if scorer is None else copy.deepcopy(scorer).eval().requires_grad_(False)

    def sync(self, policy: torch.nn.Module) -> None:
        self._push(dict(vllm_weight_names(policy.named_parameters(), self.tied_embeddings)))

    def snapshot(self) -> dict[str, Tensor]:
        """The weights last pushed (a CPU copy taken at the push), for a checkpoint."""
        return dict(self._weights)

    def load_snapshot(self, weights: dict[str, Tensor]) -> None:
        """Push a snapshot or a trainer's state dict (published weights): names are mapped either way."""
        self._push(dict(vllm_weight_names(weights.items(), self.tied_embeddings)))

    def _push(self, weights: dict[str, Tensor]) -> None:
        runner_model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        runner_model.load_weights(list(weights.items()))
        self.llm.reset_prefix_cache()
        # A copy, not the trainer's live tensors: those move on with every optimiser step.
        self._weights = {name: t.detach().to("cpu", copy=True) for name, t in weights.items()}
        if self.scorer is not None:
            missing, unexpected = self.scorer.load_state_dict(weights, strict=False)
            missing = [name for name in missing if not (self.tied_embeddings and name == "lm_head.weight")]
            if missing or unexpected:  # the scorer would score with other weights than vLLM's
                raise RuntimeError(
                    f"the trainer-precision scorer does not take vLLM's weights: missing {missing[:3]}, "
                    f"unexpected {unexpected[:3]}"
                )

    def rescore(self, rollout: Rollout, temperature: float, group_size: int = 1) -> Tensor:
        """[N, T] log-probs of vLLM's responses under the pushed weights, as the trainer computes them."""
        if self.scorer is None:
            raise RuntimeError("this vLLM engine was made without a scorer: pass the trainer's model")
        return rescore(self.scorer, rollout, temperature, group_size)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        generators: Sequence[torch.Generator] | None = None,
        group_size: int = 1,
    ) -> Rollout:
        from vllm import SamplingParams, TokensPrompt

        greedy = generators is None
        # One seed per response, derived from its group's generator only.
        seeds = [
            0 if greedy else int(torch.randint(2**31 - 1, (1,), generator=g)) + j
            for g in (generators or [None] * len(prompts))
            for j in range(group_size)
        ]
        prompts = [p for p in prompts for _ in range(group_size)]
        params = [
            SamplingParams(
                n=1,
                temperature=0.0 if greedy else temperature,
                top_p=1.0 if greedy else top_p,
                max_tokens=max_new_tokens,
                logprobs=0,
                seed=seed,
            )
            for seed in seeds
        ]
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return rollout_from_vllm(outputs, prompts, max_new_tokens, self.eos_id, self.pad_id)
