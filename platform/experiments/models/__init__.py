"""The experiments room's models: what was asked (`runs`), the work it handed out (`jobs`) and what
came of it (`results`), and what people add to them (`annotations`: tags, notes, saved views)."""

from experiments.models.annotations import ExperimentTag, Note, RunTag, SavedView, check_tag
from experiments.models.jobs import Checkpoint, PolicyVersion, RolloutJob
from experiments.models.results import Completion, MetricChunk, MetricSummary
from experiments.models.runs import (
    DatasetMismatch,
    Experiment,
    ExperimentNotDeletable,
    Run,
    SweepTemplate,
    Theta0Mismatch,
    validation_context,
)

__all__ = [
    "Checkpoint",
    "Completion",
    "DatasetMismatch",
    "Experiment",
    "ExperimentNotDeletable",
    "ExperimentTag",
    "Note",
    "RunTag",
    "SavedView",
    "check_tag",
    "MetricChunk",
    "MetricSummary",
    "PolicyVersion",
    "RolloutJob",
    "Run",
    "SweepTemplate",
    "Theta0Mismatch",
    "validation_context",
]
