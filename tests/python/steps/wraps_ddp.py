import torch


def step(ctx):
    torch.nn.parallel.DistributedDataParallel(ctx.model)
    return None
