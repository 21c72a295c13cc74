"""On rank processes a step's torch.distributed is the real Gloo process group: every
collective and op works and gives torch's own answer (checked here against values each
rank can compute alone), and then the step trains as full_finetune.py does."""

import torch
import torch.distributed as dist

import full_finetune


def cannot_run(scenario):
    if scenario["world_size"] == 1:
        return "exercises collectives across ranks"
    return full_finetune.cannot_run(scenario)


def check(what, got, want):
    if not torch.equal(got, want):
        raise AssertionError("%s: got %s, want %s" % (what, got.tolist(), want.tolist()))


def step(ctx):
    rank, world = dist.get_rank(), dist.get_world_size()
    if (rank, world) != (ctx.rank, ctx.world_size) or dist.get_backend() != "gloo":
        raise AssertionError("default group: rank %d of %d over %s, want rank %d of %d over gloo"
                             % (rank, world, dist.get_backend(), ctx.rank, ctx.world_size))
    ranks = torch.arange(world, dtype=torch.float64)
    mine = torch.tensor([float(rank + 1)], dtype=torch.float64)
    t = mine.clone(); dist.all_reduce(t, op=dist.ReduceOp.SUM); check("SUM", t, (ranks + 1).sum().view(1))
    t = mine.clone(); dist.all_reduce(t, op=dist.ReduceOp.MAX); check("MAX", t, torch.tensor([float(world)], dtype=torch.float64))
    t = mine.clone(); dist.all_reduce(t, op=dist.ReduceOp.AVG); check("AVG", t, (ranks + 1).mean().view(1))
    gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(gathered, mine)
    check("all_gather", torch.cat(gathered), ranks + 1)
    t = mine.clone(); dist.broadcast(t, src=world - 1); check("broadcast", t, torch.tensor([float(world)], dtype=torch.float64))
    out = torch.zeros(1, dtype=torch.float64)
    dist.reduce_scatter(out, [mine * (r + 1) for r in range(world)])
    check("reduce_scatter", out, ((ranks + 1) * (rank + 1)).sum().view(1))
    dist.barrier()
    return full_finetune.step(ctx)
