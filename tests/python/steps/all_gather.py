import torch
import torch.distributed as dist


def step(ctx):
    out = [torch.zeros(1) for _ in range(ctx.world_size)]
    dist.all_gather(out, torch.ones(1))
    return None
