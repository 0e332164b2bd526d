"""When a distributed or async run's rollout jobs are created and which weights they use: the two
admission policies, chosen once by the run's execution mode (`ADMISSION`)."""

from __future__ import annotations

from rlcore.config import RunConfig
from rlcore.staleness import behavior_version, steps_by_version


def group_slices(groups: int, parts: int) -> list[range]:
    """`groups` prompt groups split into `parts` consecutive slices, sizes differing by at most one."""
    bounds = [round(i * groups / parts) for i in range(parts + 1)]
    return [range(lo, hi) for lo, hi in zip(bounds, bounds[1:], strict=False)]


class Scheduled:
    """distributed: the simulated schedule exactly. Step t's jobs are created when version v(t) is
    published, and made with that version, so the curves equal the simulated run's; an evaluation
    is one job, the trainer's own evaluation."""

    fixed_versions = True  # a job's version is its step's v(t), known when it is created
    evaluates_between_batches = False  # one whole evaluation would hold a step up

    def __init__(self, config: RunConfig):
        s = config.staleness
        self.config = config
        self.schedule = (s.sync_interval, s.sync_offset, s.offline)
        self._steps_of = steps_by_version(config.steps, *self.schedule)

    def steps_to_create(self, version: int, created_upto: int) -> list[int] | None:
        """The steps whose jobs publishing `version` creates; None: no later step needs it."""
        return [t for t in self._steps_of.get(version, ()) if t > version] or None

    def version_of(self, step: int) -> int | None:
        """The version step `step`'s jobs are made with (None: the newest, chosen at claim)."""
        return behavior_version(step, *self.schedule)

    def eval_slices(self) -> list[range]:
        return [range(self.config.eval_size)]


class Admitted:
    """async: AReaL's admission rule. Jobs are created for every step up to version + 1 +
    `max_staleness` and made with the newest weights when a rollout worker claims them, so no
    batch can end up more than `max_staleness` versions behind when trained and nothing is ever
    dropped; evaluations come in parts of about half a batch's sequences (a part decodes each
    problem twice, greedy and sampled), which a rollout worker fits in between batches."""

    fixed_versions = False
    # While its next batch is unclaimed, the trainer makes eval parts with a copy of their weights.
    evaluates_between_batches = True

    def __init__(self, config: RunConfig):
        self.config = config

    def steps_to_create(self, version: int, created_upto: int) -> list[int] | None:
        """O(1) a step for any bound: only the steps this version made admissible."""
        if version + 1 > self.config.steps:
            return None  # nothing left to train: no need to publish
        admissible = min(self.config.steps, version + 1 + self.config.execution.max_staleness)
        return list(range(max(version + 1, created_upto + 1), admissible + 1))

    def version_of(self, step: int) -> int | None:
        return None

    def eval_slices(self) -> list[range]:
        rollout = self.config.rollout
        per_part = max(1, rollout.prompts_per_step * rollout.group_size // 2)
        return group_slices(self.config.eval_size, max(1, -(-self.config.eval_size // per_part)))


ADMISSION = {"distributed": Scheduled, "async": Admitted}
