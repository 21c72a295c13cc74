import torch
import torch.distributed as dist


def step(ctx):
    dist.all_reduce(torch.ones(3 + ctx.rank))
    return None
