"""`RunConfig`: the one definition of a run (task, model, algorithm, staleness, rollout, optimiser,
budget, seed). The web form, the API, the CLI and the worker all validate through it; it imports
neither torch nor Django. Paths are checked against allowed roots passed in the validation context
(`context={"data_roots": [...], "model_roots": [...]}`); every field that scales memory or time is
bounded (the per-run budget: docs/architecture.md, "Resources")."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from rlcore import presets

MAX_STEPS = 100_000
MAX_BATCH_RESPONSES = 8192  # responses per trainer step: prompts_per_step × group_size
MAX_GENERATED_TOKENS = 2**20  # new tokens of one batched generation: a step's batch, an evaluation
MAX_BUFFERED_TOKENS = 2**25  # new tokens of the batches generated ahead of their step
MAX_HELD_OUT = 10_000
MAX_SEED = 2**31
MAX_PATH = 4096
_TASK_KINDS = "arithmetic: synthetic `a+b=` sums; jsonl: question/answer pairs from a file"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_under_roots(path: str, info: ValidationInfo, key: str, what: str) -> str:
    roots = (info.context or {}).get(key)
    if roots is None:
        return path
    resolved = Path(path).expanduser().resolve()
    allowed = [Path(root).expanduser().resolve() for root in roots]
    if not any(resolved.is_relative_to(root) for root in allowed):
        shown = ", ".join(str(root) for root in allowed) or "(none configured)"
        raise ValueError(f"{what} {path!r} is outside the allowed roots: {shown}")
    return str(resolved)


class ArithmeticTask(_Strict):
    """Synthetic `a+b=` prompts; the reward is 1 iff the exact sum follows, then EOS."""

    name: Literal["arithmetic"] = Field("arithmetic", title="Task kind", description=_TASK_KINDS)
    min_operand: int = Field(
        10, ge=0, le=10**6, title="Smallest operand", description="a and b in `a+b=` are drawn from min..max"
    )
    max_operand: int = Field(
        99, ge=1, le=10**6, title="Largest operand", description="a and b in `a+b=` are drawn from min..max"
    )
    operators: list[Literal["+", "-", "*"]] = Field(
        ["+"], min_length=1, max_length=3, title="Operators", description="operators to sample, each once"
    )
    split_seed: int = Field(
        0,
        ge=0,
        lt=MAX_SEED,
        title="Split seed",
        description="fixes the held-out prompts, shared by every run",
    )
    held_out: int = Field(
        200,
        ge=1,
        le=MAX_HELD_OUT,
        title="Held-out prompts",
        description="prompts kept out of training for eval",
    )

    @field_validator("operators")
    @classmethod
    def _once_each(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("list each operator once: a repeated one would repeat problems across the split")
        return value

    @model_validator(mode="after")
    def _range(self) -> ArithmeticTask:
        if self.min_operand > self.max_operand:
            raise ValueError(f"min_operand ({self.min_operand}) must be <= max_operand ({self.max_operand})")
        if (self.max_operand - self.min_operand + 1) ** 2 < 16:
            raise ValueError("the operand range is too small: it needs at least 4 values per operand")
        return self


class JsonlTask(_Strict):
    """Question/answer pairs from a JSONL file (GSM8k format: the answer ends in `#### N`)."""

    name: Literal["jsonl"] = Field("jsonl", title="Task kind", description=_TASK_KINDS)
    path: str = Field(
        ...,
        min_length=1,
        max_length=MAX_PATH,
        title="Training file",
        description="JSONL file of question/answer pairs, under an allowed data root",
    )
    eval_path: str | None = Field(
        None,
        max_length=MAX_PATH,
        title="Evaluation file",
        description="held-out JSONL file; default: hold out part of the training file",
    )
    question_field: str = Field(
        "question", min_length=1, max_length=200, title="Question key", description="JSON key of the question"
    )
    answer_field: str = Field(
        "answer",
        min_length=1,
        max_length=200,
        title="Answer key",
        description="JSON key of the answer (ending in `#### N`)",
    )
    prompt_template: str = Field(
        "{question}\n",
        max_length=4096,
        title="Prompt template",
        description=(
            "how a question becomes a prompt: text with {question} (the question) and optionally "
            "{name} for another field of the line; {{ and }} are literal braces; no format specs, "
            "conversions, attributes or indexing"
        ),
    )
    format_reward: bool = Field(
        False, title="Format reward", description="add ±0.1 for a well-formed `#### N` answer"
    )
    answer_check: Literal["gsm8k", "math-verify"] = Field(
        "gsm8k",
        title="Answer check",
        description=(
            "gsm8k: answers end in '#### N' and the completion's final number must equal N; "
            "math-verify: the answer field is LaTeX and the completion's final answer (\\boxed{} or "
            "LaTeX) must equal it mathematically (the math-verify package)"
        ),
    )
    split_seed: int = Field(
        0, ge=0, lt=MAX_SEED, title="Split seed", description="fixes which lines are held out"
    )
    held_out: int = Field(
        200,
        ge=1,
        le=MAX_HELD_OUT,
        title="Held-out lines",
        description="lines held out for eval when there is no evaluation file",
    )

    @field_validator("path", "eval_path")
    @classmethod
    def _under_data_roots(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else _check_under_roots(value, info, "data_roots", "dataset path")

    @field_validator("prompt_template")
    @classmethod
    def _template(cls, value: str) -> str:
        names = template_fields(value)
        if "question" not in names:
            raise ValueError("prompt_template must contain {question}")
        return value


def template_fields(template: str) -> list[str]:
    """The field names of a prompt template, in order; ValueError unless every replacement field
    is a plain `{name}` (no format spec, conversion, attribute access, indexing or position)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(
            f"prompt_template is not a valid template ({exc}); write literal braces as {{{{ and }}}}"
        ) from exc
    names = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        field = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
        if not name.isidentifier():
            raise ValueError(
                f"prompt_template field {field} must be a plain {{name}} of a field of the line "
                "(no positions, attribute access or indexing)"
            )
        if conversion:
            raise ValueError(
                f"prompt_template field {field} has a conversion (!{conversion}); only {{name}} is allowed"
            )
        if spec:
            raise ValueError(
                f"prompt_template field {field} has a format spec (:{spec}); only {{name}} is allowed"
            )
        names.append(name)
    return names


Task = Annotated[ArithmeticTask | JsonlTask, Field(discriminator="name")]


class TinyModel(_Strict):
    """The built-in Llama-architecture model with a character tokenizer (docs/algorithms.md §10)."""

    hidden_size: int = Field(
        128, ge=16, le=512, title="Hidden size", description="width of the residual stream"
    )
    num_layers: int = Field(4, ge=1, le=8, title="Layers", description="transformer blocks")
    num_heads: int = Field(4, ge=1, le=16, title="Attention heads", description="must divide the hidden size")
    intermediate_size: int = Field(
        512, ge=16, le=2048, title="MLP size", description="width of the feed-forward layer"
    )
    warmstart_accuracy: float = Field(
        0.35,
        ge=0,
        lt=1,
        title="Warm-start accuracy",
        description=(
            "the supervised warm start stops at the first check (every 10 steps) at or above this "
            "held-out accuracy; docs/algorithms.md §10 calibrates θ0 near 0.3-0.4"
        ),
    )
    warmstart_max_steps: int = Field(
        3000,
        ge=0,
        le=20_000,
        title="Warm-start step limit",
        description="supervised steps at most (0: no warm start)",
    )

    @model_validator(mode="after")
    def _heads(self) -> TinyModel:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})"
            )
        return self


class ModelConfig(_Strict):
    source: Literal["tiny", "local"] = Field(
        "tiny", title="Model source", description="tiny: the built-in model; local: a Hugging Face directory"
    )
    path: str | None = Field(
        None,
        max_length=MAX_PATH,
        title="Model directory",
        description="local Hugging Face model directory (source: local)",
    )
    tiny: TinyModel = Field(TinyModel(), title="Built-in model")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", title="Weight precision", description="number format of the weights"
    )

    @field_validator("path")
    @classmethod
    def _under_model_roots(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else _check_under_roots(value, info, "model_roots", "model path")

    @model_validator(mode="after")
    def _path_needed(self) -> ModelConfig:
        if self.source == "local" and not self.path:
            raise ValueError("path is required when source is 'local'")
        return self


def _knob_properties() -> dict[str, Any]:
    """The tunable knobs of `presets.AlgorithmSpec` as schema properties, without defaults:
    a knob's value is the chosen preset's."""
    spec = TypeAdapter(presets.AlgorithmSpec).json_schema()["properties"]
    return {name: {k: v for k, v in spec[name].items() if k != "default"} for name in presets.TUNABLE}


class AlgorithmConfig(_Strict):
    preset: str = Field("rec-oneside-nois", description="one of the presets of docs/algorithms.md §4")
    params: dict[str, Any] = Field(
        default_factory=dict,
        validate_default=True,
        title="Algorithm knobs",
        description="overrides of the preset's knobs (blank: the preset's value); stored fully resolved",
        json_schema_extra=lambda schema: schema.update(properties=_knob_properties()),
    )

    @field_validator("preset")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in presets.PRESETS:
            raise ValueError(f"unknown preset {value!r}; known: {', '.join(presets.PRESETS)}")
        return value

    @field_validator("params")
    @classmethod
    def _resolve(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        preset = info.data.get("preset")
        if preset is None:  # the preset itself was invalid and is reported on its own
            return value
        return presets.resolve(preset, value).params()

    def spec(self) -> presets.AlgorithmSpec:
        return presets.resolve(self.preset, self.params)


class StalenessConfig(_Strict):
    """docs/algorithms.md §6: step t trains on a batch from policy version v(t) =
    k·max(0, ⌊(t − d − 1)/k⌋); on-policy (k = 1, d = 0) is v(t) = t − 1."""

    sync_interval: int = Field(
        1,
        ge=1,
        le=MAX_STEPS,
        title="Sync interval",
        description=(
            "k: the behaviour weights sync every k steps, v(t) = k·⌊(t − 1)/k⌋: "
            "a batch is 0 to k − 1 steps older than on-policy"
        ),
    )
    sync_offset: int = Field(
        0,
        ge=0,
        le=MAX_STEPS,
        title="Sync offset",
        description=(
            "d: step t trains on a batch from the policy d steps older than on-policy, v(t) = max(0, t − 1 − d)"
        ),
    )
    offline: bool = Field(
        False, title="Offline", description="every batch from the initial policy θ₀: v(t) = 0 for every step"
    )

    @property
    def label(self) -> str:
        if self.offline:
            return "offline"
        parts = []
        if self.sync_interval != 1:
            parts.append(f"sync_interval={self.sync_interval}")
        if self.sync_offset:
            parts.append(f"sync_offset={self.sync_offset}")
        return ",".join(parts) or "on-policy"


MAX_ROLLOUT_WORKERS = 16
# Trainer processes of one run (torchrun ranks on one machine); the platform caps it further by
# what a live worker of the run's queue has (its cores or GPUs) and LAB_MAX_TRAIN_PROCESSES.
MAX_TRAIN_PROCESSES = 64
MAX_EPOCHS = 8

SCHEDULE_MODES = ("simulated", "distributed")


class StalenessCell(StalenessConfig):
    """One cell of a sweep's staleness axis: a schedule (the fields of `StalenessConfig`), run
    `simulated` or `distributed` (`mode`; blank: the sweep's execution mode), or an async cell,
    `{"mode": "async", "max_staleness": k}`, whose staleness is measured and bounded by k."""

    mode: Literal["simulated", "distributed", "async"] | None = Field(
        None,
        title="Execution mode of the cell",
        description="simulated or distributed (a schedule cell; blank: the sweep's execution.mode), or async",
    )
    max_staleness: int | None = Field(
        None,
        ge=0,
        le=MAX_STEPS,
        title="Staleness bound",
        description="an async cell's bound k (default 1): no batch is trained more than k versions behind",
    )

    @model_validator(mode="after")
    def _kind(self) -> StalenessCell:
        if self.mode == "async" and self.schedule != StalenessConfig():
            raise ValueError(
                "an async cell measures its own staleness: it takes no sync_interval, sync_offset or "
                'offline; write it as {"mode": "async", "max_staleness": k}'
            )
        if self.max_staleness is not None and self.mode != "async":
            raise ValueError(
                'max_staleness is the bound of an async cell: write {"mode": "async", "max_staleness": k}'
            )
        return self

    @property
    def schedule(self) -> StalenessConfig:
        return StalenessConfig(
            sync_interval=self.sync_interval, sync_offset=self.sync_offset, offline=self.offline
        )

    def execution(self, base: dict[str, Any]) -> dict[str, Any]:
        """The sweep's base `execution` section for this cell: its mode and, in an async cell, its
        bound (a schedule cell drops the base's bound; a simulated one its rollout workers)."""
        if self.mode is None:
            return base
        out = {**base, "mode": self.mode}
        if self.mode == "async":
            out["max_staleness"] = 1 if self.max_staleness is None else self.max_staleness
        else:
            out.pop("max_staleness", None)
        if self.mode == "simulated":
            out.pop("rollout_workers", None)
        return out


class ExecutionConfig(_Strict):
    """Where rollouts run: in the trainer's process (simulated) or on rollout workers."""

    mode: Literal["simulated", "distributed", "async"] = Field(
        "simulated",
        title="Execution mode",
        description=(
            "simulated: one process, the exact staleness schedule; distributed: the same schedule, "
            "batches generated by rollout workers; async: rollout workers generate with the newest "
            "weights, staleness bounded by max_staleness and measured"
        ),
    )
    rollout_workers: int = Field(
        1,
        ge=1,
        le=MAX_ROLLOUT_WORKERS,
        title="Rollout workers",
        description="rollout jobs each step's batch is split into (distributed and async)",
    )
    max_staleness: int | None = Field(
        None,
        ge=0,
        le=MAX_STEPS,
        title="Staleness bound",
        description="async only (default 1): no batch is trained more than this many versions behind",
    )
    train_processes: int = Field(
        1,
        ge=1,
        le=MAX_TRAIN_PROCESSES,
        title="Trainer processes",
        description=(
            "trainer ranks on one machine (torchrun, FSDP2: the policy and its optimiser state sharded "
            "across them; gloo on CPU, NCCL on GPU), each step's batch split by whole prompt groups; "
            "the curves are one process's to float error. At most rollout.prompts_per_step ÷ "
            "optimizer.minibatches: every rank needs a prompt group of each mini-batch"
        ),
    )
    init_logprobs: Literal["trainer", "rollout", "auto"] = Field(
        "auto",
        title="θ0 log-probs",
        description=(
            "where frozen θ0's log-probs for kl/init are computed: trainer (in its update), rollout "
            "(with each batch, wherever it is made, as verl's reference worker; while a batch's rows × "
            "response tokens × vocabulary fit 2^22 floats, else by the trainer), or auto, the default "
            "(distributed and async: a rollout worker computes them for a batch when no other job "
            "waits for it, else the trainer; simulated: the trainer). Curves are the same"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _async_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("mode") == "async" and data.get("max_staleness") is None:
            return {**data, "max_staleness": 1}
        return data

    @field_validator("rollout_workers")
    @classmethod
    def _workers_need_workers(cls, value: int, info: ValidationInfo) -> int:
        if value > 1 and info.data.get("mode") == "simulated":
            raise ValueError("rollout_workers > 1 needs mode 'distributed' or 'async'")
        return value

    @field_validator("max_staleness")
    @classmethod
    def _async_only(cls, value: int | None, info: ValidationInfo) -> int | None:
        mode = info.data.get("mode")
        if value is not None and mode not in ("async", None):
            raise ValueError(
                f"max_staleness applies to mode 'async' only (mode is {mode!r}); "
                "the other modes follow the staleness schedule"
            )
        return value


class RolloutConfig(_Strict):
    group_size: int = Field(
        8,
        ge=2,
        le=256,
        title="Group size",
        description="K responses per prompt (group-relative baselines need K >= 2)",
    )
    prompts_per_step: int = Field(
        16, ge=1, le=4096, title="Prompts per step", description="prompt groups in each batch"
    )
    max_new_tokens: int = Field(
        6, ge=1, le=32_768, title="Response length limit", description="new tokens at most"
    )
    temperature: float = Field(
        1.0, gt=0, le=10, title="Sampling temperature", description="1: sample the policy as it is"
    )
    top_p: float = Field(1.0, gt=0, le=1, title="Top-p", description="nucleus sampling mass (1: off)")
    engine: Literal["hf", "vllm"] = Field(
        "hf", title="Generation engine", description="hf: Hugging Face generate; vllm: needs a GPU"
    )
    dtype: Literal["same", "bfloat16", "float16"] = Field(
        "same",
        title="Rollout precision",
        description=(
            "same: the engine generates in model.dtype; bfloat16 / float16: it generates, and reports "
            "the behaviour log-probs, from the version's weights cast to that precision while the "
            "trainer stays in model.dtype (a training–inference mismatch, logged as mismatch/*)"
        ),
    )


class OptimizerConfig(_Strict):
    lr: float = Field(3e-5, gt=0, le=1, title="Learning rate", description="AdamW step size")
    beta1: float = Field(0.9, ge=0, lt=1, title="Adam β1", description="decay of the gradient average")
    beta2: float = Field(
        0.999, ge=0, lt=1, title="Adam β2", description="decay of the squared-gradient average"
    )
    weight_decay: float = Field(0.01, ge=0, le=1, title="Weight decay", description="AdamW decoupled decay")
    grad_clip: float = Field(
        1.0, gt=0, le=1e6, title="Gradient norm clip", description="largest gradient norm"
    )
    schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", title="Learning-rate schedule", description="after warm-up"
    )
    warmup_steps: int = Field(
        0, ge=0, le=MAX_STEPS, title="Warm-up steps", description="linear ramp of the learning rate"
    )
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        le=MAX_BATCH_RESPONSES,
        title="Micro-batch size",
        description="responses per forward/backward; blank: the whole (mini-)batch at once",
    )
    minibatches: int = Field(
        1,
        ge=1,
        le=4096,
        title="Mini-batches per step",
        description=(
            "a step's batch is split into this many mini-batches of whole prompt groups (a permutation "
            "seeded by seed and step), one optimiser step each; must be <= rollout.prompts_per_step"
        ),
    )
    epochs: int = Field(
        1,
        ge=1,
        le=MAX_EPOCHS,
        title="Epochs per step",
        description=f"passes over the step's mini-batches (at most {MAX_EPOCHS}); a policy version still counts trainer steps",
    )


class RunConfig(_Strict):
    task: Task = Field(ArithmeticTask(), title="Task")
    model: ModelConfig = Field(ModelConfig(), title="Model")
    algorithm: AlgorithmConfig = Field(AlgorithmConfig(), title="Algorithm")
    staleness: StalenessConfig = Field(StalenessConfig(), title="Staleness")
    rollout: RolloutConfig = Field(RolloutConfig(), title="Rollouts")
    optimizer: OptimizerConfig = Field(OptimizerConfig(), title="Optimiser")
    execution: ExecutionConfig = Field(ExecutionConfig(), title="Execution")
    steps: int = Field(
        150, ge=1, le=MAX_STEPS, title="Trainer steps", description="trainer steps (one optimiser step each)"
    )
    eval_every: int = Field(
        15,
        ge=0,
        le=MAX_STEPS,
        title="Evaluate every",
        description="steps between evaluations; 0: evaluate only before and after",
    )
    eval_size: int = Field(
        200, ge=1, le=MAX_HELD_OUT, title="Evaluation size", description="held-out prompts per evaluation"
    )
    checkpoint_every: int = Field(
        25,
        ge=0,
        le=MAX_STEPS,
        title="Checkpoint every",
        description="steps between checkpoints; 0: never checkpoint",
    )
    samples_per_step: int = Field(
        4, ge=0, le=64, title="Samples per step", description="example completions reported per step"
    )
    seed: int = Field(0, ge=0, lt=MAX_SEED, title="Seed", description="seeds sampling and initialisation")
    device: Literal["cpu", "cuda", "auto"] = Field(
        "auto", title="Device", description="auto: a GPU if the worker has one"
    )

    @field_validator("execution")
    @classmethod
    def _execution_fits(cls, execution: ExecutionConfig, info: ValidationInfo) -> ExecutionConfig:
        rollout, staleness = info.data.get("rollout"), info.data.get("staleness")
        if rollout is not None and execution.rollout_workers > rollout.prompts_per_step:
            raise ValueError(
                f"execution.rollout_workers ({execution.rollout_workers}) must be <= "
                f"rollout.prompts_per_step ({rollout.prompts_per_step}): each job needs a prompt group"
            )
        if execution.mode == "async" and staleness is not None and staleness != StalenessConfig():
            raise ValueError(
                "staleness settings do not apply to execution mode 'async': it measures its own "
                "staleness, bounded by execution.max_staleness; keep only on-policy and set that bound, "
                "or keep the sweep's mode simulated or distributed and add async cells beside the "
                'schedules ({"mode": "async", "max_staleness": k}; on the form, "Async bounds")'
            )
        return execution

    @field_validator("device")
    @classmethod
    def _vllm_needs_a_gpu(cls, device: str, info: ValidationInfo) -> str:
        rollout = info.data.get("rollout")
        if rollout is not None and rollout.engine == "vllm" and device == "cpu":
            raise ValueError(
                "device 'cpu' cannot run rollout.engine 'vllm' (the rollout-gpu queue in distributed "
                "and async modes): use device 'cuda' or 'auto'"
            )
        return device

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if self.task.name == "arithmetic" and self.eval_size > self.task.held_out:
            raise ValueError(f"eval_size ({self.eval_size}) must be <= task.held_out ({self.task.held_out})")
        return self

    @model_validator(mode="after")
    def _minibatches_fit(self) -> RunConfig:
        opt, groups = self.optimizer, self.rollout.prompts_per_step
        if opt.minibatches > groups:
            message = (
                f"optimizer.minibatches ({opt.minibatches}) must be <= rollout.prompts_per_step ({groups}): "
                "each mini-batch holds whole prompt groups"
            )
            error = InitErrorDetails(
                type=PydanticCustomError("minibatches", message),
                loc=("optimizer", "minibatches"),
                input=opt.minibatches,
            )
            raise ValidationError.from_exception_data("RunConfig", [error])
        return self

    @model_validator(mode="after")
    def _ranks_fit(self) -> RunConfig:
        opt, groups, n = self.optimizer, self.rollout.prompts_per_step, self.execution.train_processes
        if opt.minibatches <= groups and n > groups // opt.minibatches:
            message = (
                f"execution.train_processes ({n}) must be <= rollout.prompts_per_step ÷ "
                f"optimizer.minibatches ({groups} ÷ {opt.minibatches} = {groups // opt.minibatches} prompt "
                "groups in the smallest mini-batch): every trainer process trains whole prompt groups "
                "of each mini-batch"
            )
            error = InitErrorDetails(
                type=PydanticCustomError("train_processes", message),
                loc=("execution", "train_processes"),
                input=n,
            )
            raise ValidationError.from_exception_data("RunConfig", [error])
        return self

    @model_validator(mode="after")
    def _budget(self) -> RunConfig:
        """The per-run budget (module docstring); each error is reported on the field that
        tips the product over, and names every factor."""
        r = self.rollout
        responses = r.prompts_per_step * r.group_size
        step_tokens = responses * r.max_new_tokens
        errors: list[InitErrorDetails] = []

        def over(loc: tuple[str, ...], value: Any, message: str) -> None:
            errors.append(InitErrorDetails(type=PydanticCustomError("budget", message), loc=loc, input=value))

        if responses > MAX_BATCH_RESPONSES:
            over(
                ("rollout", "prompts_per_step"),
                r.prompts_per_step,
                f"rollout.prompts_per_step × rollout.group_size ({r.prompts_per_step} × {r.group_size} = "
                f"{responses:,} responses per step) must be <= {MAX_BATCH_RESPONSES:,}",
            )
        elif step_tokens > MAX_GENERATED_TOKENS:
            over(
                ("rollout", "max_new_tokens"),
                r.max_new_tokens,
                f"rollout.prompts_per_step × rollout.group_size × rollout.max_new_tokens ({r.prompts_per_step} × "
                f"{r.group_size} × {r.max_new_tokens} = {step_tokens:,} new tokens per step) must be <= "
                f"{MAX_GENERATED_TOKENS:,}",
            )
        eval_tokens = self.eval_size * r.max_new_tokens
        if eval_tokens > MAX_GENERATED_TOKENS:
            over(
                ("eval_size",),
                self.eval_size,
                f"eval_size × rollout.max_new_tokens ({self.eval_size} × {r.max_new_tokens} = {eval_tokens:,} "
                f"new tokens per evaluation) must be <= {MAX_GENERATED_TOKENS:,}",
            )
        warm_check = self.task.held_out * r.max_new_tokens
        # The built-in model's warm start checks every held-out prompt at once (a jsonl task's
        # evaluation file is checked whole: its length is the file's).
        held_out_checked = self.task.name == "arithmetic" or not self.task.eval_path
        if self.model.source == "tiny" and held_out_checked and warm_check > MAX_GENERATED_TOKENS:
            over(
                ("task", "held_out"),
                self.task.held_out,
                f"task.held_out × rollout.max_new_tokens ({self.task.held_out} × {r.max_new_tokens} = "
                f"{warm_check:,} new tokens per warm-start check of the built-in model) must be <= "
                f"{MAX_GENERATED_TOKENS:,}",
            )
        if self.execution.mode == "async":
            ahead, loc, name = (
                self.execution.max_staleness or 0,
                ("execution", "max_staleness"),
                "execution.max_staleness",
            )
        else:
            ahead, loc, name = (
                self.staleness.sync_offset,
                ("staleness", "sync_offset"),
                "staleness.sync_offset",
            )
        if responses <= MAX_BATCH_RESPONSES and ahead * step_tokens > MAX_BUFFERED_TOKENS:
            over(
                loc,
                ahead,
                f"{name} × new tokens per step ({ahead} × {step_tokens:,} = {ahead * step_tokens:,} tokens of "
                f"batches generated ahead) must be <= {MAX_BUFFERED_TOKENS:,}",
            )
        if errors:
            raise ValidationError.from_exception_data("RunConfig", errors)
        return self

    @property
    def batch_size(self) -> int:
        """Responses per trainer step."""
        return self.rollout.prompts_per_step * self.rollout.group_size

    @property
    def rollout_precision(self) -> str:
        """The precision the rollout engine generates in: `rollout.dtype`, or `model.dtype` for same."""
        return self.model.dtype if self.rollout.dtype == "same" else self.rollout.dtype

    @property
    def rescored(self) -> bool:
        """Whether the engine can disagree with the trainer holding the same weights (another
        precision than the trainer's, or vLLM's kernels): then every batch is re-scored in the
        trainer's precision where it is made (`mismatch/*`); otherwise the trainer measures the gap
        on its on-policy rows (docs/algorithms.md §14)."""
        return self.rollout_precision != self.model.dtype or self.rollout.engine == "vllm"

    @property
    def queue(self) -> str:
        """The worker queue of the run's training job."""
        return "gpu" if self.device == "cuda" or self.rollout.engine == "vllm" else "cpu"

    @property
    def rollout_queue(self) -> str | None:
        """The worker queue of the run's rollout jobs; None when the trainer generates itself."""
        if self.execution.mode == "simulated":
            return None
        return "rollout-gpu" if self.rollout.engine == "vllm" else "rollout"

    @property
    def staleness_label(self) -> str:
        """The run's cell on the staleness axis: the schedule's label (`sync_offset=2`), marked
        when rollout workers run it (`sync_offset=2 (distributed)`), or the async bound (`async ≤ 2`)."""
        return cell_label(self.execution.mode, self.staleness.label, self.execution.max_staleness)


def cell_label(mode: str, schedule_label: str, max_staleness: int | None) -> str:
    """The label of a cell on the staleness axis (`RunConfig.staleness_label`)."""
    if mode == "async":
        return f"async ≤ {max_staleness}"
    if mode == "distributed":
        return f"{schedule_label} (distributed)"
    return schedule_label


def error_list(exc: ValidationError) -> list[tuple[str, str]]:
    """(dotted field, message) for each error, in a form people read."""
    out = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"] if part not in ("arithmetic", "jsonl")]
        msg = err["msg"].removeprefix("Value error, ")
        out.append((".".join(loc) or "config", msg))
    return out


def load(path: str | Path, context: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML or JSON config file; ValueError names the file and every bad field."""
    import json

    import yaml

    path = Path(path)
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of fields at the top level")
    try:
        return RunConfig.model_validate(data, context=context)
    except ValidationError as exc:
        lines = "\n".join(f"  {field}: {msg}" for field, msg in error_list(exc))
        raise ValueError(f"{path}: invalid run config\n{lines}") from exc
