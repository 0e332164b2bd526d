"""Run by `test_comms.py` under torchrun: FSDP2's custom collectives of `rlcore.comms` on gloo
against gloo's own all-gather and reduce-scatter, on the same inputs, in one sequence that grows
the shared arena, alternates its slots and mixes dtypes and sizes; each rank writes what it saw."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from rlcore import comms, distributed

torch.set_num_threads(1)
dist.init_process_group("gloo")
group = dist.group.WORLD
me, world = dist.get_rank(), dist.get_world_size()
if sys.argv[2:] == ["pairwise"]:
    all_gather, reduce_scatter = comms.PairwiseAllGather(), comms.PairwiseReduceScatter()
else:
    all_gather, reduce_scatter = comms.cpu_comms()
if sys.argv[2:] == ["full"]:  # /dev/shm cannot hold the slots: the bytes go as sends instead

    def no_room(fd: int, offset: int, length: int) -> None:
        raise OSError(28, "No space left on device")

    os.posix_fallocate = no_room
report: dict = {"kinds": [type(all_gather).__name__, type(reduce_scatter).__name__], "cases": []}
# sizes in elements per rank: small, a growth, a smaller one after it, one past two slots' size
for case, (per_rank, dtype) in enumerate(
    [
        (5, torch.float32),
        (1 << 16, torch.float32),
        (7, torch.bfloat16),
        (3 << 16, torch.float64),
        (1, torch.int64),
    ]
):
    generator = torch.Generator().manual_seed(1000 * case + me)
    # Small whole numbers: their sums are exact in every dtype and order, so any world compares exactly.
    full = torch.randint(-8, 9, (world * per_rank,), generator=generator).to(dtype)
    mine = torch.empty(per_rank, dtype=dtype)
    reduce_scatter(mine, full, group, dist.ReduceOp.SUM)
    expected = torch.empty(per_rank, dtype=dtype)
    dist.reduce_scatter_tensor(expected, full.clone(), op=dist.ReduceOp.SUM, group=group)
    gathered = torch.empty(world * per_rank, dtype=dtype)
    all_gather(gathered, mine, group)
    expected_gathered = torch.empty(world * per_rank, dtype=dtype)
    dist.all_gather_into_tensor(expected_gathered, expected, group=group)
    in_place = torch.empty(world * per_rank, dtype=dtype)  # FSDP's way: the input is the output's chunk
    in_place.view(world, -1)[me].copy_(mine)
    all_gather(in_place, in_place.view(world, -1)[me], group)
    report["cases"].append(
        {
            "dtype": str(dtype),
            "reduce_scatter": bool(torch.equal(mine, expected)),
            "all_gather": bool(torch.equal(gathered, expected_gathered)),
            "in_place": bool(torch.equal(in_place, expected_gathered)),
        }
    )
# Back to back, rank 1 slow to read after each barrier: a rank must never write over what the
# other has yet to read (the arena's two slots in turn).
if me == 1 and isinstance(all_gather, comms.SharedAllGather):
    meet = comms.Arena.meet

    def slow_meet(arena: comms.Arena) -> None:
        meet(arena)
        time.sleep(0.02)

    comms.Arena.meet = slow_meet
back_to_back = []
for i in range(6):
    full = torch.full((world * 4,), float(i)) + me  # rank r sends i + r
    mine = torch.empty(4)
    reduce_scatter(mine, full, group, dist.ReduceOp.SUM)
    back_to_back.append(mine.tolist())
report["back_to_back"] = back_to_back == [[float(sum(i + r for r in range(world)))] * 4 for i in range(6)]
report["shared_memory"] = bool(getattr(all_gather, "arenas", None)) and not any(
    arena.full for arena in all_gather.arenas.values()
)
dist.barrier()
with open(os.path.join(sys.argv[1], f"rank-{me}.json"), "w") as out:
    json.dump(report, out)
dist.barrier()
distributed.end_process(0)  # as the trainer's ranks end: gloo's teardown can abort a finished rank
