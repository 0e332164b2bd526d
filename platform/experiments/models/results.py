"""What runs report: metric series in chunks with a summary per metric, and example completions."""

from __future__ import annotations

import numpy as np
from django.db import models

from experiments import packing


class MetricChunk(models.Model):
    """Up to `CHUNK_STEPS` points of one metric of one run: those whose steps share
    `step >> CHUNK_BITS` (`chunk`), their steps, values and wall times packed as
    `experiments.packing` says. While a chunk is a series' newest it grows by parts: part 0, then
    one raw part per flush with the points it added (after every step before it); once the series
    moves past it (or the run's sink closes) it is stored whole and packed as part 0 alone.
    Written and read through `experiments.series` only.

    The unique index (run, name, chunk, part) is the only index besides the key: it leads with
    the run, so it serves the run's foreign key too."""

    run = models.ForeignKey(
        "experiments.Run", on_delete=models.CASCADE, related_name="metric_chunks", db_index=False
    )
    name = models.CharField(max_length=100)
    chunk = models.BigIntegerField(help_text="the steps' step >> CHUNK_BITS")
    part = models.IntegerField(
        default=0, help_text="0: the chunk (packed once passed); 1…: points a later flush added, raw"
    )
    count = models.IntegerField(help_text="points in the chunk")
    packed = models.BooleanField(
        default=True, help_text="false: raw, the series' newest chunk while it grows"
    )
    step_data = models.BinaryField()
    value_data = models.BinaryField()
    time_data = models.BinaryField()

    class Meta:
        ordering = ["run", "name", "chunk", "part"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "name", "chunk", "part"], name="one_chunk_part_per_run_name"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name}[{self.chunk}]×{self.count}"

    @classmethod
    def series(cls, run_id: int, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(steps, values, wall times in µs) of one metric of one run, sorted by step: its chunks'
        parts in order (`experiments.series` keeps them disjoint and ascending). A damaged chunk
        raises `packing.Damaged`."""
        rows = cls.objects.filter(run_id=run_id, name=name).order_by("chunk", "part")
        parts = [
            packing.decode(chunk, packed, bytes(steps), bytes(values), bytes(times), count=count)
            for chunk, packed, steps, values, times, count in rows.values_list(
                "chunk", "packed", "step_data", "value_data", "time_data", "count"
            )
        ]
        if not parts:
            return np.empty(0, np.int64), np.empty(0), np.empty(0, np.int64)
        return tuple(np.concatenate(columns) for columns in zip(*parts, strict=True))


class MetricSummary(models.Model):
    """One metric of one run summed up, kept up to date as its points arrive (`experiments.series`):
    lists, sorting, the query language and final values read this row, never the points. The
    fields are `experiments.packing.summarise`'s; those "of finite values" leave NaN and ±infinity out."""

    run = models.ForeignKey(
        "experiments.Run", on_delete=models.CASCADE, related_name="metric_summaries", db_index=False
    )
    name = models.CharField(max_length=100)
    count = models.IntegerField(help_text="points logged")
    last_step = models.BigIntegerField()
    last = models.FloatField(null=True, help_text="the value at the last step; null if NaN or infinite")
    finite = models.IntegerField(help_text="points with a finite value")
    first_step = models.BigIntegerField(null=True)
    first = models.FloatField(null=True, help_text="the first finite value")
    last_finite_step = models.BigIntegerField(null=True)
    last_finite = models.FloatField(null=True, help_text="the last finite value")
    min = models.FloatField(null=True)
    max = models.FloatField(null=True)
    total = models.FloatField(null=True, help_text="sum of the finite values (null if it overflowed)")
    area = models.FloatField(null=True, help_text="trapezoids under the finite values over their steps")
    tail = models.BinaryField(
        default=bytes, help_text="the last TAIL finite values, float64 little-endian (packing.pack_tail)"
    )

    class Meta:
        ordering = ["run", "name"]
        constraints = [models.UniqueConstraint(fields=["run", "name"], name="one_summary_per_run_name")]

    def __str__(self) -> str:
        return f"{self.name}: {self.count} points, last {self.last}"

    @property
    def mean(self) -> float | None:
        return None if self.total is None or not self.finite else self.total / self.finite

    def mean_last(self, k: int) -> float | None:
        """The mean of the last `k` (1…TAIL) finite values."""
        from experiments import packing

        return packing.mean_last({"tail": packing.unpack_tail(self.tail)}, k)


class Completion(models.Model):
    run = models.ForeignKey("experiments.Run", on_delete=models.CASCADE, related_name="completions")
    step = models.IntegerField()
    prompt = models.TextField()
    completion = models.TextField()
    reward = models.FloatField(null=True)

    class Meta:
        ordering = ["run", "-step", "id"]
        indexes = [models.Index(fields=["run", "step"])]

    def __str__(self) -> str:
        return f"step {self.step}: {self.prompt!r} → {self.completion!r}"
