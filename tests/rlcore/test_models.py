"""The built-in tiny model: character tokenizer, warm start, on-disk cache; local models."""

import fcntl
import itertools
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from rlcore import models, tasks
from rlcore.config import RunConfig
from rlcore.sinks import ListSink, Stopped


def test_char_tokenizer_round_trips_every_character_and_adds_bos():
    tok = models.char_tokenizer()
    text = models.CHARS + "Question: 12 + 34 = ?\n#### 46"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) == len(text) + 1
    assert tok.decode(ids, skip_special_tokens=True) == text


THETA0_PROBE = """
import sys, torch
torch.set_num_threads(int(sys.argv[1]))
from rlcore import models, tasks
from rlcore.config import RunConfig
config = RunConfig.model_validate({"device": "cpu"})
lm = models.load(config, torch.device("cpu"), sys.argv[2], tasks.build(config.task))
print(models.weights_sha256(lm.model))
"""


def test_the_default_tiny_theta0_is_the_same_bytes_with_any_thread_count_and_cache(tmp_path):
    shipped = models.SHIPPED / f"tiny-{models.tiny_cache_key(RunConfig())}"
    assert (shipped / "model.safetensors").exists(), "rebuild it: python -m rlcore build-tiny --force"
    hashes = set()
    for threads in (1, 2):
        cache = tmp_path / f"cache-{threads}"
        out = subprocess.run(
            [sys.executable, "-c", THETA0_PROBE, str(threads), str(cache)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": str(threads)},
        ).stdout
        hashes.add(out.strip().splitlines()[-1])
        assert not cache.exists() or not any(cache.iterdir()), "nothing was built: the shipped θ0 was used"
    assert hashes == {(shipped / "theta0.sha256").read_text().strip()}


def test_weights_hash_names_the_bytes_not_the_dtype_or_order():
    a = torch.nn.Linear(3, 2)
    b = torch.nn.Linear(3, 2)
    b.load_state_dict(a.state_dict())
    assert models.weights_sha256(a) == models.weights_sha256(b.double())
    with torch.no_grad():
        b.weight[0, 0] += 1e-3
    assert models.weights_sha256(a) != models.weights_sha256(b)


def test_tiny_model_is_cached_and_loaded_like_a_local_model(small_config, cache_dir):
    config = small_config()
    task = tasks.build(config.task)
    first = models.tiny_model_path(config, task, cache_dir)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert models.tiny_model_path(config, task, cache_dir) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp, "the cached model is not rebuilt"
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= {p.name for p in first.iterdir()}

    lm = models.load(config, torch.device("cpu"), cache_dir, task)
    assert lm.model.config.model_type == "llama"
    accuracy = models.evaluate(lm, task, task.held_out, config.rollout.max_new_tokens).accuracy
    assert config.model.tiny.warmstart_accuracy <= accuracy < 1.0

    local = small_config(model={"source": "local", "path": str(first)})
    again = models.load(local, torch.device("cpu"), cache_dir, task)
    for a, b in zip(lm.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_warm_start_reports_its_steps_and_accuracy_on_the_first_load_only(small_config, tmp_path):
    # A unique, never-cached size; an unreachable target, so it runs to warmstart_max_steps.
    tiny = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 40}
    config = small_config(model={"tiny": {**tiny, "warmstart_max_steps": 100, "warmstart_accuracy": 0.99}})
    task = tasks.build(config.task)
    sink = ListSink()
    models.load(config, torch.device("cpu"), tmp_path, task, sink.phase)
    assert [name for name, _ in sink.phases] == ["warm_start"] * 11
    assert [(d["step"], d["max_steps"]) for _, d in sink.phases] == [(s, 100) for s in range(0, 101, 10)]
    assert all(0.0 <= d["accuracy"] < 0.99 for _, d in sink.phases)

    cached = ListSink()
    models.load(config, torch.device("cpu"), tmp_path, task, cached.phase)
    assert cached.phases == []


def test_cache_key_follows_what_shapes_the_model(small_config):
    base = models.tiny_cache_key(small_config())
    assert models.tiny_cache_key(small_config(seed=5)) == base, "the run seed does not change θ0"
    assert models.tiny_cache_key(small_config(model={"tiny": {"hidden_size": 64}})) != base
    assert models.tiny_cache_key(small_config(task={"name": "arithmetic", "max_operand": 50})) != base


def test_a_missing_local_model_directory_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory with a Hugging Face model"):
        models.load_pretrained(str(tmp_path / "nope"), "float32", torch.device("cpu"))


# A size no other test builds and an unreachable target: a warm start that would run 20,000 steps.
ENDLESS = {
    "hidden_size": 16,
    "num_layers": 1,
    "num_heads": 2,
    "intermediate_size": 24,
    "warmstart_max_steps": 20_000,
    "warmstart_accuracy": 0.99,
}


def test_the_warm_start_stops_when_asked_and_leaves_no_folder_behind(small_config, tmp_path):
    config = small_config(model={"tiny": ENDLESS})
    task = tasks.build(config.task)
    sink = ListSink()
    asked: list[float] = []

    def should_stop() -> bool:
        asked.append(time.monotonic())
        return any(details["step"] >= 20 for _, details in sink.phases)

    with pytest.raises(Stopped, match="asked to stop after warm-start step"):
        models.load(config, torch.device("cpu"), tmp_path, task, sink.phase, should_stop)
    steps = [details["step"] for _, details in sink.phases]
    assert steps[-1] >= 20 and steps[-1] < 20_000 - models.WARMSTART_CHECK_EVERY
    assert len(asked) >= 2 and all(
        later - earlier >= models.STOP_POLL_S for earlier, later in itertools.pairwise(asked)
    ), "asked at most once a poll interval: a query per step would slow a worker's warm start"
    assert [p.name for p in tmp_path.iterdir()] == [f"tiny-{models.tiny_cache_key(config)}.lock"]


def test_a_stop_asked_before_the_warm_start_takes_no_step(small_config, tmp_path):
    config = small_config(model={"tiny": ENDLESS})
    sink = ListSink()
    with pytest.raises(Stopped, match="after warm-start step 0 of 20000"):
        models.load(config, torch.device("cpu"), tmp_path, tasks.build(config.task), sink.phase, lambda: True)
    assert [details["step"] for _, details in sink.phases] == [0]


def test_a_stop_is_heard_while_another_process_builds_the_same_model(small_config, tmp_path):
    config = small_config(model={"tiny": ENDLESS})
    name = f"tiny-{models.tiny_cache_key(config)}"
    with open(tmp_path / f"{name}.lock", "w") as held:  # another process's build holds the lock
        fcntl.flock(held, fcntl.LOCK_EX)
        started = time.monotonic()
        with pytest.raises(Stopped, match=f"while another process builds {name}"):
            models.tiny_model_path(config, tasks.build(config.task), tmp_path, should_stop=lambda: True)
        assert time.monotonic() - started < models.STOP_POLL_S, "asked before waiting"


KILLED_BUILD = """
import sys, torch
torch.set_num_threads(1)
from rlcore import models, tasks
from rlcore.config import RunConfig
config = RunConfig.model_validate({"device": "cpu", "model": {"tiny": %r}})
def phase(name, **details):
    print(details["step"], flush=True)
models.tiny_model_path(config, tasks.build(config.task), sys.argv[1], phase)
"""


def test_a_build_killed_outright_leaves_a_folder_the_next_build_removes(small_config, tmp_path):
    killed = subprocess.Popen(
        [sys.executable, "-c", KILLED_BUILD % (ENDLESS,), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        assert killed.stdout.readline().strip() == "0", "the warm start began"
    finally:
        killed.kill()
        killed.wait()
    key = models.tiny_cache_key(RunConfig.model_validate({"device": "cpu", "model": {"tiny": ENDLESS}}))
    (left,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert left.name.startswith(f"tiny-{key}-"), "SIGKILL left its temporary folder"
    # A build of that key in progress elsewhere keeps its folder while it holds the key's lock.
    building = tmp_path / f"tiny-{'0' * 16}-inprogress"
    building.mkdir()
    with open(tmp_path / f"tiny-{'0' * 16}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        config = small_config(model={"tiny": {**ENDLESS, "warmstart_max_steps": 10}})
        built = models.tiny_model_path(config, tasks.build(config.task), tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted([built.name, building.name])


def test_the_cache_key_follows_the_dataset_files_bytes(small_config, tmp_path):
    data = tmp_path / "train.jsonl"
    lines = [{"question": f"What is {a}+{a}?", "answer": f"#### {2 * a}"} for a in range(40)]
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    config = small_config(task={"name": "jsonl", "path": str(data), "held_out": 8})
    before = models.tiny_cache_key(config)
    assert models.tiny_cache_key(config) == before
    data.write_text("".join(json.dumps({**line, "answer": "#### 0"}) + "\n" for line in lines))
    assert models.tiny_cache_key(config) != before, "θ0 warm-started on the old lines is not served"
