"""What the API's sweep, experiment and run operations take and answer, as OpenAPI documents it."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from ninja import Field, Schema
from pydantic import StringConstraints

from lab.schemas import DocumentedAs, NoNul
from rlcore.config import RunConfig, StalenessCell


class SweepIn(Schema):
    name: Annotated[NoNul, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
    team: NoNul = Field(description="the name of one of your teams")
    description: NoNul = ""
    config: Annotated[dict[str, Any], DocumentedAs(RunConfig)] = Field(
        {},
        description="the base RunConfig of every run (any field left out takes its default); "
        "algorithm.preset, staleness and seed come from presets, staleness and seeds",
    )
    presets: list[str] = Field(description="rlcore presets (python -m rlcore presets), one run each")
    staleness: list[Annotated[dict[str, Any], DocumentedAs(StalenessCell)]] = Field(
        [{}],
        description='staleness cells, one run each: a schedule ({} is on-policy, {"sync_offset": 2}), '
        'run in config.execution.mode unless the cell sets "mode" (simulated or distributed), or an '
        'async cell {"mode": "async", "max_staleness": k}',
    )
    seeds: list[int] = Field([0], description="seeds, one run each")
    axes: dict[str, list[Any]] = Field(
        {},
        description="other config fields to vary, dotted, each with its values: every combination is a cell "
        '(e.g. {"optimizer.minibatches": [1, 4], "rollout.dtype": ["same", "bfloat16"], '
        '"algorithm.params.anchor": ["behaviour", "proximal", "loglinear"]}); a run\'s values are its variant',
    )
    serial: bool = Field(
        False,
        description="measure the runs one at a time: each starts only when no other run is running, and no "
        "other run starts while it runs, so that its throughput is not the machine's load",
    )
    mirror: dict[str, Any] = Field(
        {},
        description='where the runs are also mirrored, over the team\'s setting: {"mlflow_uri": an http(s) '
        'MLflow tracking server or "" for none, "tensorboard": true to write TensorBoard event files under '
        "each run's folder}; a field left out takes the team's setting",
    )


class SeedsIn(Schema):
    seeds: int = Field(
        ge=1, le=64, description="how many seeds to add: each cell of the sweep again with the next seeds"
    )


class SeedsOut(Schema):
    experiment: int
    seeds: list[int] = Field(description="the seeds added")
    runs: list[int] = Field(description="the runs queued, one per cell and new seed")


class SweepOut(Schema):
    experiment: int
    runs: list[int]
    message: str = Field(
        description="that the runs are queued, and whether the message broker could not be reached "
        "(then they are sent to workers as soon as it is back)"
    )


class ExperimentOut(Schema):
    id: int
    name: str
    team: str
    owner: str
    description: str
    created: datetime
    archived: datetime | None
    runs: int
    active: int


API_PAGE_LIMIT = 100


API_MAX_LIMIT = 1000


MAX_OFFSET = 2**63 - 1  # PostgreSQL's OFFSET is a bigint


class PageParams(Schema):
    limit: int = Field(API_PAGE_LIMIT, ge=1, le=API_MAX_LIMIT, description="items per page")
    offset: int = Field(0, ge=0, le=MAX_OFFSET, description="items to skip")


class PageOut(Schema):
    count: int = Field(description="items in all, on every page")
    limit: int
    offset: int
    next: str | None = Field(description="URL of the next page; null on the last")
    previous: str | None = Field(description="URL of the previous page; null on the first")


class ExperimentPageOut(PageOut):
    items: list[ExperimentOut]


class CancelledOut(Schema):
    cancelled: int = Field(description="runs cancelled: queued ones at once, running ones at their next step")


class DeletedOut(Schema):
    experiment: int
    runs: int
    points: int
    completions: int


class RunOut(Schema):
    id: int
    experiment: int
    preset: str
    staleness: str = Field(
        description="the run's staleness cell as a label: on-policy, sync_interval=8, sync_offset=4, offline, "
        "marked (distributed) when rollout workers ran the schedule, or async ≤ k "
        "(the numbers are in the run's config)"
    )
    variant: dict[str, Any] = Field(
        description="its values of the sweep's axes besides presets, staleness and seeds (config field → value)"
    )
    seed: int
    status: str
    tags: list[str] = Field(description="the run's own tags (its experiment's are on the experiment)")
    archived: datetime | None = Field(
        description="when it was set aside (left out of lists, comparisons and claims); null while it is in"
    )
    attempt: int
    queue: str
    dispatched_at: datetime | None = Field(
        description="when the current attempt's message was last sent to the broker; null while the "
        "broker could not be reached (a worker's dispatcher sends it when the broker is back)"
    )
    execution_mode: str
    worker: str
    progress: int
    steps: int
    heartbeat: datetime | None
    started: datetime | None
    finished: datetime | None
    error: str
    summary: dict[str, float | None] = Field(
        description="once it ended: steps, completed, eval/accuracy_initial and the latest eval/accuracy, "
        "reward/mean and kl/init (from the points it logged if it failed), collapsed (1 or 0) and "
        "collapsed_step; weights/* and idle/* of distributed and async runs"
    )
    collapsed: bool | None = Field(
        description="its held-out accuracy fell to near zero and stayed there (experiments.collapse); "
        "null until it ended"
    )
    imported: bool = Field(
        description="read from another tool's file (POST /api/experiments/{id}/imports): read-only, its "
        "provenance in the run's `imported_from`"
    )


class RunTagsIn(Schema):
    runs: list[int] | None = Field(None, description="the runs to tag, by id")
    q: NoNul | None = Field(None, description="or every run of your teams this runs query matches")
    add: list[NoNul] = Field(default_factory=list, description="tags to add")
    remove: list[NoNul] = Field(default_factory=list, description="tags to remove")


class TaggedOut(Schema):
    runs: int = Field(description="runs tagged")
    added: int = Field(description="tags added (a tag a run already had is not counted)")
    removed: int


class TagsIn(Schema):
    add: list[NoNul] = Field(default_factory=list)
    remove: list[NoNul] = Field(default_factory=list)


class TagsOut(Schema):
    tags: list[str]


class NoteIn(Schema):
    text: NoNul = Field(description="plain text, shown escaped")


class NoteOut(Schema):
    id: int
    author: str
    text: str
    created: datetime


class NoteDeletedOut(Schema):
    note: int


class ViewIn(Schema):
    name: NoNul
    query: NoNul = Field(description="a runs query")
    team: int | None = Field(None, description="the team it is shared with (default: your first team)")


class ViewOut(Schema):
    id: int
    team: int
    name: str
    query: str
    author: str
    created: datetime


class ViewsOut(Schema):
    views: list[ViewOut]


class ViewDeletedOut(Schema):
    view: int


class RunPageOut(PageOut):
    items: list[RunOut]


class WarmStartOut(Schema):
    step: int | None
    max_steps: int | None
    accuracy: float | None


class ProgressOut(Schema):
    phase: str = Field(
        description="waiting, starting, preparing, warm_start, training, evaluating, checkpointing; "
        "empty once the run is over"
    )
    text: str = Field(description="the phase in words, as the pages show it")
    step: int
    steps: int
    s_per_step: float | None = Field(description="seconds per trainer step in this attempt so far")
    eta_s: float | None = Field(description="seconds to the last step at that pace")
    warm_start: WarmStartOut | None = Field(description="the tiny model's warm start (first run only)")
    no_worker: str = Field(description="names a queue the run needs that no live worker listens on")
    queue_position: int | None = Field(
        description="while queued: its place among its team's queued runs of its queue (1: next); "
        "teams take turns for workers"
    )


class ProvenanceAttemptOut(Schema):
    attempt: int | None = Field(
        description="the attempt that recorded it; null: recorded before attempts were told apart"
    )
    provenance: dict[str, Any] = Field(description="that attempt's record, as `provenance`")


class RunDetailOut(RunOut):
    config: Annotated[dict[str, Any], DocumentedAs(RunConfig)] = Field(
        description="the fully resolved RunConfig"
    )
    rollout_jobs: dict[str, int] = Field(
        description="how many of the run's rollout jobs are in each status (distributed and async runs)"
    )
    progress_report: ProgressOut
    provenance: dict[str, Any] = Field(
        description="theta0_sha256, dataset_sha256 (jsonl tasks), rlcore_version, git_commit, torch, "
        "transformers, vllm, device, torch_threads, host; empty until a worker loaded θ0"
    )
    provenance_history: list[ProvenanceAttemptOut] = Field(
        description="every attempt's provenance, oldest first (the last is `provenance`): an attempt "
        "refused for reading other dataset bytes or loading another θ0 than the experiment's records none"
    )
    imported_from: dict[str, Any] | None = Field(
        description="an imported run's provenance: tool, tool_version, original_run_id, file_name, file_size, "
        "sha256, run_name (the run read, in a file that holds several), mapping (source metric name → lab name), points, first_time and last_time (the file's own), "
        "imported_by, imported_at; null for the lab's own runs"
    )


class MetricsOut(Schema):
    run: int
    metrics: dict[str, list[tuple[int, float | None]]] = Field(
        description="per metric name its [step, value] points in step order; null for NaN or infinity"
    )
    damaged: dict[str, list[str]] = Field(
        description="per metric with points stored in a damaged chunk (unreadable, left out of `metrics`) "
        "a note for each such chunk naming its steps"
    )
