"""Models: the built-in tiny model (a small Llama with a character tokenizer, warm-started on the
task and cached under a key hashed from everything that shapes it, the dataset files' bytes
included, so every run of a sweep starts from the same θ0) and any local Hugging Face model
directory, loaded the same way."""

from __future__ import annotations

import fcntl
import hashlib
import json
import re
import shutil
import string
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from rlcore import tasks
from rlcore.config import RunConfig
from rlcore.rollout import Rollout, decode
from rlcore.sinks import WARM_START, Stopped, ignore_phase, never_stop
from rlcore.tasks import Problem, Task

RECIPE_VERSION = 2  # bump when the tiny model's recipe changes, to invalidate caches (and rebuild SHIPPED)
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARS = string.digits + string.ascii_letters + " +-*/=#.,:;?!()'\"$%&<>[]_\n"
ROUND_TRIP_PROBE = "Question: 12 + 34 = ?\nAnswer: 46"
WARMSTART_BATCH = 128
WARMSTART_LR = 1e-3
# Often enough that the warm start stops near its target, whatever the CPU's float rounding.
WARMSTART_CHECK_EVERY = 10
# How often a warm start, or a wait for another process's, asks whether to stop (in a worker, a
# database query): a cancel ends it within about this plus one step or one evaluation.
STOP_POLL_S = 1.0
# A build's temporary folder: `tiny-<key>-<random>` beside the `tiny-<key>` it becomes.
BUILDING = re.compile(r"(tiny-[0-9a-f]{16})-")
# θ0 of the default tiny model, built once by `python -m rlcore build-tiny` and shipped with the
# package, so every machine and thread count starts from the same bytes.
SHIPPED = Path(__file__).resolve().parent / "tiny_models"


@dataclass
class LoadedModel:
    """A causal LM with the token ids the rollout needs."""

    model: torch.nn.Module
    tokenizer: object
    eos_id: int
    pad_id: int

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [self.tokenizer(t)["input_ids"] for t in texts]

    def decode_responses(self, rollout: Rollout) -> list[str]:
        """Response text without EOS and padding."""
        lengths = rollout.response_mask.sum(dim=1).long().tolist()
        out = []
        for ids, length in zip(rollout.response_ids.tolist(), lengths, strict=True):
            tokens = [t for t in ids[:length] if t != self.eos_id]
            out.append(self.tokenizer.decode(tokens, skip_special_tokens=True))
        return out


def char_tokenizer():
    """A character-level fast tokenizer that adds BOS and round-trips text exactly."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate([*SPECIALS, *CHARS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


def tiny_cache_key(config: RunConfig) -> str:
    shaping = {
        "recipe": RECIPE_VERSION,
        "tiny": config.model.tiny.model_dump(),
        "task": config.task.model_dump(),
        "max_new_tokens": config.rollout.max_new_tokens,
    }
    datasets = tasks.dataset_sha256s(config.task)
    if datasets:  # an edited file is warm-started on anew, never served the θ0 of its old lines
        shaping["dataset_sha256"] = datasets
    return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]


def resolve_device(name: str) -> torch.device:
    """The torch device `name` (cpu, cuda, auto) means here; an error when cuda is asked for and absent."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but no CUDA device is available; use 'cpu' or 'auto'")
    return torch.device(name)


def load(
    config: RunConfig,
    device: torch.device,
    cache_dir: Path | None = None,
    task: Task | None = None,
    phase: Callable[..., None] = ignore_phase,
    should_stop: Callable[[], bool] = never_stop,
) -> LoadedModel:
    """θ0 for `config`: the cached (or freshly warm-started) tiny model, or a local model.

    A warm start reports its progress as `phase(WARM_START, step=, max_steps=, accuracy=)` and
    raises `Stopped` once `should_stop()` says so.
    """
    if config.model.source == "local":
        return load_pretrained(config.model.path, config.model.dtype, device)
    if task is None:
        raise ValueError("the tiny model needs its task to warm-start")
    path = tiny_model_path(config, task, cache_dir, phase, should_stop)
    return load_pretrained(str(path), config.model.dtype, device)


def load_pretrained(path: str, dtype: str, device: torch.device) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if not Path(path).is_dir():
        raise FileNotFoundError(f"model path {path!r} is not a directory with a Hugging Face model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = tokenizer(ROUND_TRIP_PROBE, add_special_tokens=False)["input_ids"]
    if tokenizer.decode(ids) != ROUND_TRIP_PROBE:
        raise ValueError(
            f"the tokenizer in {path} does not round-trip text ({tokenizer.decode(ids)!r}); "
            "it would corrupt prompts and completions"
        )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise ValueError(f"the tokenizer in {path} has no EOS token")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    return LoadedModel(model=model, tokenizer=tokenizer, eos_id=eos_id, pad_id=pad_id)


def tiny_model_path(
    config: RunConfig,
    task: Task,
    cache_dir: Path | None,
    phase: Callable[..., None] = ignore_phase,
    should_stop: Callable[[], bool] = never_stop,
) -> Path:
    """The warm-started tiny model's directory: the shipped one for the default config (the same
    bytes everywhere), else built once per cache key (file-locked) under `cache_dir`, in a
    temporary folder renamed into place when done and removed on any other exit (`Stopped`
    included: while it waits for another process's build of the same key, too).
    Temporary folders that builds killed outright left behind are removed here."""
    key = tiny_cache_key(config)
    shipped = SHIPPED / f"tiny-{key}"
    if (shipped / "config.json").exists():
        return shipped
    cache_dir = Path(cache_dir or Path(tempfile.gettempdir()) / "rlcore-cache")
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / f"tiny-{key}"
    with open(cache_dir / f"{target.name}.lock", "w") as lock:
        while not _try_lock(lock):
            if should_stop():
                raise Stopped(f"asked to stop while another process builds {target.name}")
            time.sleep(STOP_POLL_S)
        remove_killed_builds(cache_dir, holding=target.name)
        if not (target / "config.json").exists():
            building = Path(tempfile.mkdtemp(prefix=f"{target.name}-", dir=cache_dir))
            try:
                build_tiny(config, task, building, phase, should_stop)
                shutil.rmtree(target, ignore_errors=True)
                building.rename(target)
            finally:  # a failed or interrupted build (a memory ceiling, a cancel) leaves nothing
                shutil.rmtree(building, ignore_errors=True)
    return target


def _try_lock(lock) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def remove_killed_builds(cache_dir: Path, holding: str) -> None:
    """Remove the temporary folders of builds killed before they could remove their own (SIGKILL,
    a lost machine): those of `holding`, the cache entry whose lock this process holds, and of
    every entry whose lock nobody holds (a build in progress holds its entry's lock)."""
    for folder in cache_dir.iterdir():
        match = BUILDING.match(folder.name)
        if match is None or not folder.is_dir():
            continue
        if match.group(1) == holding:
            shutil.rmtree(folder, ignore_errors=True)
            continue
        with open(cache_dir / f"{match.group(1)}.lock", "a") as lock:
            if _try_lock(lock):
                shutil.rmtree(folder, ignore_errors=True)


def build_tiny(
    config: RunConfig,
    task: Task,
    out: Path,
    phase: Callable[..., None] = ignore_phase,
    should_stop: Callable[[], bool] = never_stop,
) -> None:
    """Create the tiny model and warm-start it on `task` (`Stopped` if asked to stop); write it to `out`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tiny = config.model.tiny
    tokenizer = char_tokenizer()
    longest = max(len(p.prompt) + len(p.solution) for p in task.train_problems(1000) + task.held_out)
    llama = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=tiny.hidden_size,
        num_hidden_layers=tiny.num_layers,
        num_attention_heads=tiny.num_heads,
        num_key_value_heads=tiny.num_heads,
        intermediate_size=tiny.intermediate_size,
        max_position_embeddings=max(64, 2 * (longest + config.rollout.max_new_tokens + 2)),
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(llama)
    loaded = LoadedModel(model, tokenizer, tokenizer.eos_token_id, tokenizer.pad_token_id)
    warm_start(
        loaded,
        task,
        tiny.warmstart_accuracy,
        tiny.warmstart_max_steps,
        config.rollout.max_new_tokens,
        phase,
        should_stop,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def warm_start(
    lm: LoadedModel,
    task: Task,
    target_accuracy: float,
    max_steps: int,
    max_new_tokens: int,
    phase: Callable[..., None] = ignore_phase,
    should_stop: Callable[[], bool] = never_stop,
) -> float:
    """Supervised steps on (prompt → solution EOS) until held-out greedy accuracy ≥ target.

    Reports `phase(WARM_START, step=, max_steps=, accuracy=)` whenever it measures the accuracy.
    Asks `should_stop()` before a step once `STOP_POLL_S` have passed since it last asked (and
    before the first), and raises `Stopped` when it says so.
    """
    model = lm.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARMSTART_LR)
    generator = torch.Generator().manual_seed(0)
    accuracy = evaluate(lm, task, task.held_out, max_new_tokens).accuracy
    phase(WARM_START, step=0, max_steps=max_steps, accuracy=accuracy)
    ask_at = time.monotonic()
    for step in range(1, max_steps + 1):
        if accuracy >= target_accuracy:
            break
        if time.monotonic() >= ask_at:
            if should_stop():
                raise Stopped(f"asked to stop after warm-start step {step - 1} of {max_steps}")
            ask_at = time.monotonic() + STOP_POLL_S
        batch = task.sample(WARMSTART_BATCH, generator)
        ids, labels, attention = supervised_batch(lm, batch)
        model.train()
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % WARMSTART_CHECK_EVERY == 0:
            accuracy = evaluate(lm, task, task.held_out, max_new_tokens).accuracy
            phase(WARM_START, step=step, max_steps=max_steps, accuracy=accuracy)
    model.eval()
    return accuracy


def supervised_batch(
    lm: LoadedModel, problems: list[Problem]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, labels (−100 outside the solution and EOS) and attention mask."""
    rows = []
    for p in problems:
        prompt = lm.tokenizer(p.prompt)["input_ids"]
        solution = lm.tokenizer(p.solution, add_special_tokens=False)["input_ids"] + [lm.eos_id]
        rows.append((prompt + solution, [-100] * len(prompt) + solution))
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), lm.pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row_ids, row_labels) in enumerate(rows):
        ids[i, : len(row_ids)] = torch.tensor(row_ids)
        labels[i, : len(row_labels)] = torch.tensor(row_labels)
        attention[i, : len(row_ids)] = 1
    device = next(lm.model.parameters()).device
    return ids.to(device), labels.to(device), attention.to(device)


@dataclass(frozen=True)
class EvalResult:
    """Greedy held-out results over `n` problems, as sums so that parts of one held-out set
    evaluated apart (rollout workers) add up to exactly the whole."""

    n: int
    correct: float
    reward_sum: float

    @property
    def accuracy(self) -> float:
        return self.correct / self.n

    @property
    def reward(self) -> float:
        return self.reward_sum / self.n


# Prompts decoded at once in an evaluation: its KV cache, not the held-out set, sets the memory.
EVAL_ROWS = 256


def evaluate(
    lm: LoadedModel,
    task: Task,
    problems: list[Problem],
    max_new_tokens: int,
    model: torch.nn.Module | None = None,
) -> EvalResult:
    """Greedy held-out accuracy and mean reward of `model` (default `lm.model`), `EVAL_ROWS`
    prompts at a time."""
    model = model if model is not None else lm.model
    scores = []
    for lo in range(0, len(problems), EVAL_ROWS):
        chunk = problems[lo : lo + EVAL_ROWS]
        with torch.inference_mode():
            rollout = decode(
                model,
                lm.encode([p.prompt for p in chunk]),
                max_new_tokens,
                temperature=1.0,
                top_p=1.0,
                generators=None,
                eos_id=lm.eos_id,
                pad_id=lm.pad_id,
            )
        texts = lm.decode_responses(rollout)
        scores += [task.score(p, t, bool(f)) for p, t, f in zip(chunk, texts, rollout.finished, strict=True)]
    return EvalResult(
        n=len(scores),
        correct=float(sum(s.correct for s in scores)),
        reward_sum=float(sum(s.reward for s in scores)),
    )


def weights_sha256(model: torch.nn.Module) -> str:
    """A hash of the model's weights: every state-dict tensor by name, as contiguous float32 bytes,
    so the same θ0 has the same hash on every machine, whatever dtype it was loaded in."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()
