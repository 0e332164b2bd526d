"""A trainer process's place among a run's trainer ranks (`execution.train_processes`), and the
collectives the trainer step puts their parts together with (`rlcore.distributed` sets them up)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist


def cuts(groups: int, parts: int) -> list[int]:
    """Group indices where each of `parts` near-equal parts after the first starts."""
    return [round(i * groups / parts) for i in range(1, parts)]


@dataclass(frozen=True)
class Ranks:
    """This process's place among the run's trainer processes, and the collectives
    `trainer.train_step` puts their parts together with."""

    rank: int
    world: int

    def share(self, n: int, group_size: int) -> slice:
        """This rank's rows of `n` consecutive rows: a contiguous run of whole prompt groups,
        near-equal across ranks."""
        groups = n // group_size
        bounds = [0, *cuts(groups, self.world), groups]
        return slice(bounds[self.rank] * group_size, bounds[self.rank + 1] * group_size)

    def passes(self, n: int, group_size: int, micro: int) -> int:
        """The micro-batch passes of the rank with the most rows of `n`: every rank makes as many."""
        shares = [replace(self, rank=r).share(n, group_size) for r in range(self.world)]
        return max(math.ceil((s.stop - s.start) / micro) for s in shares)

    def assemble(self, mine: torch.Tensor, rows: slice, n: int) -> torch.Tensor:
        """The [n, …] tensor whose `rows` this rank computed (`mine`) and the other ranks the
        rest: every rank gets the whole of it, exactly (each entry is a sum of zeros and one
        value)."""
        whole = mine.new_zeros((n, *mine.shape[1:]))
        whole[rows] = mine
        dist.all_reduce(whole)
        return whole

    def sum_floats(self, values: dict[str, float]) -> dict[str, float]:
        """`values` summed over the ranks (in float64)."""
        summed = torch.tensor(list(values.values()), dtype=torch.float64, device=_device())
        dist.all_reduce(summed)
        return dict(zip(values, summed.tolist(), strict=True))

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value` on every rank (picklable objects; tensors travel on the CPU)."""
        box = [value if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def _device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )
