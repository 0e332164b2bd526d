"""One run's trainer in several processes (`execution.train_processes` = N > 1): the ranks that
`rlcore.launch.start_ranks` starts under torchrun, each running `train`.

- The default process group is created first, with an explicit timeout (`LAB_RANK_TIMEOUT_S`,
  default 600 s: a rank stuck in a collective ends there instead of holding its machine), then
  an explicit one-dimensional device mesh: gloo on CPU, NCCL on GPU.
- The policy is sharded with FSDP2: `fully_shard` on each decoder layer, then on the root; its
  gradients are summed across ranks, not averaged (every rank's loss is already divided by the
  whole batch's counts). The AdamW state lives with the shards. Frozen θ0 stays whole on every
  rank (kl/init reads it at every response position). The weights are gathered once per
  optimiser step (one all-gather per FSDP unit, at the publish) and stay whole through its forwards and backward passes, going back to their
  shards once those are done (`Ranks.after_backward`); the gradients are reduced once per unit.
  On gloo both collectives go through shared memory between the ranks of the host (FSDP2's
  custom comms, `rlcore.comms`) instead of gloo's loopback sockets.
- Every rank holds the whole batch and runs `trainer.train_step` on it alike (`Ranks`): each
  forward and backward takes the rank's share of whole prompt groups, every rank making as many
  passes as the busiest; log-probs and sums are put together across ranks before anything reads
  them, so advantages, M2PO's whole-batch mask, mini-batch permutations, the proximal log-probs
  and every §7 metric are one process's, to float error.
- Generation never runs on the sharded policy: the rollout engine's own copy (synced from the
  gathered parameters at a publish under the simulated schedule) generates, and a whole copy of
  the current weights (`mirror`, filled by every rank at each evaluation, and at each publish
  outside the simulated schedule: `gather_into`) evaluates and is what gets published, so ranks
  whose responses end at different lengths wait for nobody. Under the
  simulated schedule every rank runs the schedule itself, each generating its share of each
  batch's prompt groups (`SharedProducer`: every group has its own random stream, so the shares
  put together are one process's batch, to float error) and the shares exchanged, and the held-out
  evaluation is split across the ranks and its sums added up. In distributed and async execution
  rank 0 holds the worker's `DatabaseSource` (which publishes the mirror for the rollout workers
  and hands its evaluations to eval jobs) and hands each batch to the others (its tensors pickled
  as numpy arrays).
- Rank 0 alone reports to the sink (nothing is logged twice) and decides when to stop.
- Checkpoints are `torch.distributed.checkpoint` folders (`step-000025.dcp`): model and optimiser
  state sharded, plus rank 0's `trainer.pt` (the step, the config, the schedule's state, the
  batch source's, the progress), hashed as one for the ledger. The data position is the global
  step. A checkpoint resumes with the same number of ranks; another number is refused, saying so.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import datetime
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from rlcore import checkpoints, comms, models, provenance, sources, tasks
from rlcore.batch import Batch
from rlcore.config import RunConfig
from rlcore.evaluate import EvalSums, Evaluator
from rlcore.produce import Producer
from rlcore.ranks import Ranks, cuts
from rlcore.sinks import (
    EVALUATING,
    PREPARING,
    Sample,
    Sink,
    Stopped,
)
from rlcore.trainer import Learner, Progress, local_source, prepare, steps

TIMEOUT_ENV = "LAB_RANK_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0
THREADS_ENV = "LAB_RANK_THREADS"
META = "trainer.pt"  # rank 0's part of a sharded checkpoint


# ----- the process group and the shards ------------------------------------------------------


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send `sig` to this process when its parent dies (prctl PR_SET_PDEATHSIG), so
    a rank never outlives the torchrun that started it; nothing elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG


def end_process(code: int) -> NoReturn:
    """End this rank's process with `code` once its work is done and its output flushed, skipping
    the interpreter's teardown: there a rank that had finished could still abort (SIGABRT,
    "terminate called without an active exception", seen about once in ten 2-rank runs on gloo)
    while the collectives' threads were torn down, and torchrun would fail the whole run for it."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def init(config: RunConfig) -> tuple[Ranks, torch.device, Any]:
    """This rank's process group (from torchrun's environment), with an explicit timeout, then
    the device mesh over it; its device; the threads torch uses (`LAB_RANK_THREADS`)."""
    set_parent_death_signal()
    if os.getppid() == 1:  # torchrun died before the signal was asked for
        raise SystemExit("the launcher of this rank is gone")
    threads = int(os.environ.get(THREADS_ENV) or os.environ.get("OMP_NUM_THREADS") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    timeout = datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))
    want_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    if want_cuda:
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    backend = "nccl" if device.type == "cuda" else "gloo"
    # The default group first, with our timeout: a mesh built first would make one with torch's.
    dist.init_process_group(backend, timeout=timeout, device_id=device if backend == "nccl" else None)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    return Ranks(dist.get_rank(), dist.get_world_size(), after_backward=reshard), device, mesh


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (`model.model.layers` and the like)."""
    for owner in (getattr(model, "model", None), getattr(model, "transformer", None), model):
        for name in ("layers", "h", "blocks"):
            layers = getattr(owner, name, None) if owner is not None else None
            if isinstance(layers, torch.nn.ModuleList) and len(layers):
                return list(layers)
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__} to shard")


def shard(model: torch.nn.Module, mesh: Any) -> None:
    """FSDP2: each decoder layer, then the root, on `mesh`; gradients summed across ranks.
    Parameters gathered for a forward stay whole through the backward passes that follow (no
    second all-gather in a backward, nor in the second of `score_responses`' two forwards): the
    trainer shards them again once a mini-batch's backward passes are done (`reshard`, as
    `Ranks.after_backward`), so at rest each rank holds only its shards."""
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    all_gather, reduce_scatter = comms.cpu_comms() if dist.get_backend() == "gloo" else (None, None)
    for module in fsdp_modules(model):
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)
        module.set_reshard_after_backward(False, recurse=False)
        if all_gather is not None:
            module.set_custom_all_gather(all_gather)
            module.set_custom_reduce_scatter(reduce_scatter)


def fsdp_modules(model: torch.nn.Module) -> list[Any]:
    """The modules of `model` that `shard` made FSDP units (the decoder layers, the root)."""
    from torch.distributed.fsdp import FSDPModule

    return [module for module in model.modules() if isinstance(module, FSDPModule)]


def gather(policy: torch.nn.Module) -> None:
    """Gather the sharded policy's whole weights into its own parameters (a collective: every rank
    calls it): one all-gather per FSDP unit, all of them started before any is waited on. They stay
    whole, as plain tensors, until `reshard` (or the backward of the forward that comes next)."""
    handles = [unit.unshard(async_op=True) for unit in fsdp_modules(policy)]
    for handle in handles:
        if handle is not None:
            handle.wait()


def gather_into(mirror: torch.nn.Module, policy: torch.nn.Module, keep: bool = False) -> torch.nn.Module:
    """Copy the sharded policy's whole weights into `mirror` (a collective: every rank calls it).
    With `keep`, the policy's parameters stay gathered for the forward that comes next (its
    backward shards them again); otherwise they are sharded again here."""
    gather(policy)
    whole = dict(mirror.named_parameters())
    with torch.no_grad():
        for name, param in policy.named_parameters():
            full = param.full_tensor() if hasattr(param, "full_tensor") else param
            whole[name].copy_(full)
    if not keep:
        reshard(policy)
    return mirror


def reshard(policy: torch.nn.Module) -> None:
    """Leave every FSDP unit of `policy` sharded (nothing to do where it already is)."""
    for unit in fsdp_modules(policy):
        unit.reshard()


def held_bytes(learner: Learner) -> int:
    """Bytes of the policy's parameters and optimiser state this rank holds (its shards)."""

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    total = sum(local(p).numel() * p.element_size() for p in learner.policy.parameters())
    for state in learner.optimizer.state.values():
        total += sum(local(t).numel() * t.element_size() for t in state.values() if torch.is_tensor(t))
    return total


# ----- the batch source, across ranks ---------------------------------------------------------


@dataclass
class SharedProducer(Producer):
    """A `Producer` on each rank, every one generating its share of each batch's prompt groups
    (`Ranks.share`), the shares then exchanged: every rank gets the whole batch, one process's to
    float error (each group samples from its own random stream, `group_rngs`). A collective:
    the simulated schedule is deterministic, so every rank asks for the same batches in the same
    order. The batch's `generate_s` is the slowest rank's (they generate side by side)."""

    ranks: Ranks | None = None

    def batch(
        self,
        step: int,
        version: int,
        groups: range | None = None,
        spare_time: Callable[[], bool] | None = None,
    ) -> Batch:
        if groups is not None:
            raise ValueError("a shared producer makes whole batches: its ranks choose the groups")
        prompts, size = self.config.rollout.prompts_per_step, self.config.rollout.group_size
        rows = self.ranks.share(prompts * size, size)
        mine = super().batch(step, version, range(rows.start // size, rows.stop // size), spare_time)
        state = mine.to_state()
        state["tensors"] = {name: _as_array(t) for name, t in state["tensors"].items()}
        parts = []
        for part in self.ranks.gather(state):
            part["tensors"] = {name: _as_tensor(a) for name, a in part["tensors"].items()}
            parts.append(Batch.from_state(part))
        batch = Batch.concat([p for p in parts if p.rewards.numel()])
        return replace(batch, generate_s=max(p.generate_s for p in parts))


class RankSource:
    """The run's batch source as every rank sees it: each publish and evaluation first gathers
    the whole weights (all ranks): under the simulated schedule the engine syncs from the
    gathered parameters; otherwise, and for evaluations, into `mirror`, which the source works
    with. Under the simulated schedule (`simulated`) every rank holds one (`inner`, with a `SharedProducer`)
    and the held-out evaluation is split across the ranks; otherwise rank 0 holds it (`inner`
    is None on the other ranks) and hands each batch to the others."""

    def __init__(
        self, ranks: Ranks, inner: sources.BatchSource | None, mirror: torch.nn.Module, simulated: bool
    ):
        self.ranks, self.inner, self.mirror, self.simulated = ranks, inner, mirror, simulated

    def publish(self, version: int, policy: torch.nn.Module) -> None:
        # The step's forward comes next, on these same weights: they stay gathered for it.
        if self.simulated:
            # The schedule's engine copies what it needs straight from the gathered parameters.
            gather(policy)
            self.inner.publish(version, policy)
            return
        gather_into(self.mirror, policy, keep=True)
        if self.inner is not None:
            self.inner.publish(version, self.mirror)

    def take(self, step: int) -> Batch:
        if self.simulated:  # every rank's schedule hands out the same whole batch
            return self.inner.take(step)
        state: Any = None
        if self.inner is not None:
            try:
                state = self.inner.take(step).to_state()
                # As numpy arrays the tensors pickle as their bytes (a tensor's storage pickles
                # through torch.save, several times slower on a batch this small).
                state["tensors"] = {name: _as_array(t) for name, t in state["tensors"].items()}
            except Stopped as stopped:
                state = str(stopped) or "stopped"
        state = self.ranks.broadcast(state)
        if isinstance(state, str):
            raise Stopped(state)
        state["tensors"] = {name: _as_tensor(a) for name, a in state["tensors"].items()}
        return Batch.from_state(state)

    def evaluate(self, step: int, policy: torch.nn.Module, evaluator: Evaluator) -> dict[str, float] | None:
        gather_into(self.mirror, policy)
        if self.simulated:
            return evaluate_split(self.ranks, evaluator, self.mirror, step)
        return self.inner.evaluate(step, self.mirror, evaluator) if self.inner is not None else {}

    def initial_evaluation(self, policy: torch.nn.Module, evaluator: Evaluator) -> dict[str, float]:
        """θ0's held-out evaluation (step 0), made here as one process makes it: split across the
        ranks under the simulated schedule, else on rank 0."""
        gather_into(self.mirror, policy)
        if self.simulated:
            return evaluate_split(self.ranks, evaluator, self.mirror, 0)
        return evaluator.evaluate(self.mirror, step=0) if self.inner is not None else {}

    def evaluations(self, wait: bool) -> list[tuple[int, dict[str, float]]]:
        return self.inner.evaluations(wait) if self.inner is not None else []

    def state(self) -> dict[str, Any]:
        return self.inner.state() if self.inner is not None else {}

    def load_state(self, state: dict[str, Any]) -> None:
        if self.inner is not None:
            self.inner.load_state(state)

    def resume_problem(self, step: int) -> str:
        return self.inner.resume_problem(step) if self.inner is not None else ""

    def resume(self, step: int) -> None:
        if self.inner is not None:
            self.inner.resume(step)


def _as_array(t: torch.Tensor) -> Any:
    """`t` as a numpy array where numpy has its dtype (bfloat16 stays a tensor)."""
    return t.numpy() if t.dtype != torch.bfloat16 else t


def _as_tensor(a: Any) -> torch.Tensor:
    return torch.from_numpy(a) if not torch.is_tensor(a) else a


def evaluate_split(
    ranks: Ranks, evaluator: Evaluator, policy: torch.nn.Module, step: int
) -> dict[str, float]:
    """The held-out evaluation of `policy` (whole, on every rank) after `step`: each rank its
    near-equal share of the problems, the sums added up across ranks."""
    size = evaluator.config.eval_size
    bounds = [0, *cuts(size, ranks.world), size]
    first, stop = bounds[ranks.rank], bounds[ranks.rank + 1]
    part = evaluator.evaluate_part(policy, step, first, stop) if stop > first else EvalSums()
    total = ranks.sum_floats({k: float(v) for k, v in asdict(part).items()})
    return EvalSums(**{**total, "n": int(round(total["n"]))}).metrics()


# ----- the training loop ----------------------------------------------------------------------


class _Silent:
    """The sink of ranks other than 0: they report nothing."""

    def log(self, step: int, metrics: dict[str, float]) -> None: ...
    def sample(self, step: int, samples: list[Sample]) -> None: ...
    def should_stop(self) -> bool:
        return False

    def flush(self) -> None: ...
    def phase(self, name: str, **details: float) -> None: ...
    def provenance(self, record: dict[str, object]) -> None: ...
    def note(self, text: str) -> None: ...


def train(
    config: RunConfig,
    sink: Sink | None,
    *,
    checkpoint_dir: Path | None = None,
    cache_dir: Path | None = None,
    make_source: Callable[[Learner, torch.nn.Module], sources.BatchSource] | None = None,
    ledger: checkpoints.Ledger | None = None,
    keep_checkpoints: int = checkpoints.KEEP,
    on_done: Callable[[Learner, Ranks], None] | None = None,
) -> dict[str, float]:
    """`trainer.train` for one rank of `config.execution.train_processes` (started by torchrun):
    the same curve, reported by rank 0 alone through `sink` (the other ranks' sinks are not
    used: None will do). `make_source(learner, mirror)` makes rank 0's batch source from the whole-weights copy
    `mirror` (default: the simulated schedule); only rank 0's is used. `on_done` hears the learner when the loop ends,
    on every rank (tests measure the shards). Ends the process group before returning."""
    ranks, device, mesh = init(config)
    try:
        summary = _train(
            ranks, device, mesh, config, sink if ranks.rank == 0 and sink is not None else _Silent(), checkpoint_dir, cache_dir,
            make_source, ledger, keep_checkpoints, on_done,
        )  # fmt: skip
        dist.barrier()  # every rank is done with every collective before the group goes
        return summary
    finally:
        dist.destroy_process_group()


def _train(
    ranks: Ranks,
    device: torch.device,
    mesh: Any,
    config: RunConfig,
    sink: Sink,
    checkpoint_dir: Path | None,
    cache_dir: Path | None,
    make_source: Callable[[Learner, torch.nn.Module], sources.BatchSource] | None,
    ledger: checkpoints.Ledger | None,
    keep: int,
    on_done: Callable[[Learner, Ranks], None] | None,
) -> dict[str, float]:
    sink.phase(PREPARING)
    # Rank 0 makes sure θ0 is there first (a new tiny model's warm start reports to its sink and
    # stops when asked); the other ranks then read it.
    stop = None
    if ranks.rank == 0 and config.model.source == "tiny":
        try:
            models.tiny_model_path(config, tasks.build(config.task), cache_dir, sink.phase, sink.should_stop)
        except Stopped as stopped:
            stop = str(stopped) or "stopped"
    if ranks.broadcast(stop) is not None:
        return {"steps": 0.0, "completed": 0.0}
    learner = prepare(config, cache_dir, device=device, shard=lambda model: shard(model, mesh))
    mirror = copy.deepcopy(learner.initial)  # θ0's architecture, to hold the whole current weights
    if ranks.rank == 0:
        record = provenance.record(config, learner.initial, device)
        record.update(
            train_processes=ranks.world, backend=dist.get_backend(), threads_per_rank=torch.get_num_threads()
        )
        sink.provenance(record)
    whole = replace(learner, lm=replace(learner.lm, model=mirror))  # generation sees whole weights
    # Rank 0's choice: the other ranks are not handed `make_source` (only rank 0 calls it).
    simulated = ranks.broadcast(make_source is None)
    inner = None
    if simulated:
        inner = local_source(whole, cache_dir)
        inner.producer = SharedProducer(
            **{f.name: getattr(inner.producer, f.name) for f in fields(Producer)}, ranks=ranks
        )
    elif ranks.rank == 0:
        inner = make_source(learner, mirror)
    source = RankSource(ranks, inner, mirror, simulated=simulated)
    progress = Progress()
    if checkpoint_dir is not None and ledger is None:
        ledger = checkpoints.FileLedger(checkpoint_dir)
    start = 1 + (
        resume(checkpoint_dir, ledger, learner, source, progress, sink, ranks) if checkpoint_dir else 0
    )
    source.resume(start - 1)
    if start == 1:
        sink.phase(EVALUATING, step=0)
        progress.initial_eval = source.initial_evaluation(learner.policy, learner.evaluator)
        progress.last.update(progress.initial_eval)
        sink.log(0, progress.initial_eval)

    def save(step: int) -> None:
        save_checkpoint(checkpoint_dir, step, learner, source, progress, ledger, ranks, keep)

    summary = steps(
        learner, source, sink, progress, start, save if checkpoint_dir is not None else None, ranks
    )
    reshard(learner.policy)  # a stop right after a publish leaves the weights gathered for its forward
    if on_done is not None:
        on_done(learner, ranks)
    return summary


# ----- sharded checkpoints --------------------------------------------------------------------


def save_checkpoint(
    directory: Path,
    step: int,
    learner: Learner,
    source: RankSource,
    progress: Progress,
    ledger: checkpoints.Ledger,
    ranks: Ranks,
    keep: int = checkpoints.KEEP,
) -> Path:
    """Every rank writes its shards of the policy and the optimiser state, rank 0 the rest
    (`META`), into a temporary folder; rank 0 then records the folder's sha256 in `ledger`,
    gives it its name and keeps the newest `keep`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    directory = Path(directory)
    target = checkpoints.sharded_path_of(directory, step)
    building = target.with_name(f".{target.name}.building")
    if ranks.rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        checkpoints.remove_tree(building)
    ranks.broadcast(None)  # the folder is clear before anyone writes
    model_state, optim_state = get_state_dict(learner.policy, learner.optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(building))
    if ranks.rank == 0:
        meta = {
            "step": step,
            "config": learner.config.model_dump_json(),
            "train_processes": ranks.world,
            "scheduler": learner.scheduler.state_dict(),
            "source": source.state(),
            "progress": asdict(progress),
        }
        torch.save(meta, building / META)
    ranks.broadcast(None)  # every shard is written
    if ranks.rank == 0:
        checkpoints.commit_sharded(building, target, step, ledger, keep)
    ranks.broadcast(None)
    return target


def resume(
    directory: Path,
    ledger: checkpoints.Ledger,
    learner: Learner,
    source: RankSource,
    progress: Progress,
    sink: Sink,
    ranks: Ranks,
) -> int:
    """`trainer.resume` for sharded checkpoints: rank 0 picks the newest trusted one (damaged ones
    set aside, as there), every rank loads its shards from it. Raises `CheckpointError` when
    checkpoints were there and none can be trusted, or when the chosen one was written by
    another number of ranks or another config."""
    choice: Any = None
    if ranks.rank == 0:
        try:
            choice = _choose(directory, ledger, learner, source, sink, ranks)
        except checkpoints.CheckpointError as exc:
            choice = {"error": str(exc)}
    choice = ranks.broadcast(choice)
    if isinstance(choice, dict):
        raise checkpoints.CheckpointError(choice["error"])
    if choice is None:
        return 0
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(choice)
    model_state, optim_state = get_state_dict(learner.policy, learner.optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(
        learner.policy, learner.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    meta = torch.load(path / META, map_location="cpu", weights_only=True)
    learner.scheduler.load_state_dict(meta["scheduler"])
    source.load_state(meta["source"])
    progress.restore(meta["progress"])
    return int(meta["step"])


def _choose(
    directory: Path,
    ledger: checkpoints.Ledger,
    learner: Learner,
    source: RankSource,
    sink: Sink,
    ranks: Ranks,
) -> str | None:
    """Rank 0: the folder of the newest checkpoint to resume from, or None (start from step 0)."""
    found = checkpoints.existing_sharded(directory)
    if not found and (single := checkpoints.existing(directory)):
        raise checkpoints.CheckpointError(
            f"checkpoint {single[0][1].name} was written by one trainer process and this attempt has "
            f"{ranks.world}: resume it with execution.train_processes 1"
        )
    rejected, passed = [], []
    for step, path in checkpoints.trusted(found, ledger, rejected):
        try:
            meta = torch.load(path / META, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise checkpoints.CheckpointError(
                f"{path.name} cannot be read: {type(exc).__name__}: {exc}"
            ) from exc
        written_by = int(meta["train_processes"])
        if written_by != ranks.world:
            raise checkpoints.CheckpointError(
                f"checkpoint {path.name} was written by {written_by} trainer processes and this attempt "
                f"has {ranks.world}: resume it with execution.train_processes {written_by}"
            )
        if meta["config"] != learner.config.model_dump_json():
            raise checkpoints.CheckpointError(
                f"checkpoint {path.name} was written by a different run config; refusing to resume"
            )
        if why_not := source.resume_problem(step):
            passed.append(f"{path.name}: {why_not}")
            continue
        if rejected or passed:
            sink.note(f"resumed from {path.name}, passing over {'; '.join(rejected + passed)}")
        return str(path)
    if rejected and not passed:
        raise checkpoints.CheckpointError(
            f"no checkpoint can be trusted: {'; '.join(rejected)}. Set aside as {checkpoints.REJECTED_SUFFIX}; "
            "a retry starts the run from step 0"
        )
    if found:
        sink.note(f"started again from step 0, passing over {'; '.join(rejected + passed)}")
    return None
