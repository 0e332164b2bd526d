"""A trainer process's place among a run's trainer ranks (`execution.train_processes`), and the
collectives the trainer step puts their parts together with (`rlcore.distributed` sets them up)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
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
    # What the policy needs once a mini-batch's backward passes are all done and before its
    # gradients are read (`rlcore.distributed`: its parameters go back to their shards).
    after_backward: Callable[[torch.nn.Module], None] | None = field(default=None, compare=False)

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

    def assemble(self, mine: torch.Tensor, rows: slice, n: int, extra: float | None = None) -> Any:
        """The [n, …] tensor whose `rows` this rank computed (`mine`) and the other ranks the
        rest: every rank gets the whole of it, exactly (each entry is a sum of zeros and one
        value). With `extra`, that number summed over the ranks comes with it, in the same
        collective: (the tensor, the sum)."""
        size = math.prod((n, *mine.shape[1:]))
        flat = mine.new_zeros(size + (extra is not None))
        whole = flat[:size].view(n, *mine.shape[1:])
        whole[rows] = mine
        if extra is not None:
            flat[size] = extra
        dist.all_reduce(flat)
        return whole if extra is None else (whole, float(flat[size]))

    def sum_tensor(self, value: torch.Tensor) -> torch.Tensor:
        """`value` summed over the ranks (a new tensor; `value` is left as it was)."""
        summed = value.detach().clone()
        dist.all_reduce(summed)
        return summed

    def sum_floats(self, values: dict[str, float]) -> dict[str, float]:
        """`values` summed over the ranks (in float64)."""
        summed = torch.tensor(list(values.values()), dtype=torch.float64, device=_device())
        dist.all_reduce(summed)
        return dict(zip(values, summed.tolist(), strict=True))

    def backward_done(self, policy: torch.nn.Module) -> None:
        """Every backward pass of a mini-batch has run: `after_backward`, where there is one."""
        if self.after_backward is not None:
            self.after_backward(policy)

    def broadcast_flag(self, value: bool) -> bool:
        """Rank 0's `value` on every rank (one small tensor collective, nothing pickled)."""
        flag = torch.tensor([int(bool(value)) if self.rank == 0 else 0], device=_device())
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order, on every rank (picklable objects)."""
        box: list[Any] = [None] * self.world
        dist.all_gather_object(box, value)
        return box

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
