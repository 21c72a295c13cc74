"""Calls fully_shard on a built-in model, whose forward runs in C++ on gradnorm's tensors:
refused by name."""

from torch.distributed.fsdp import fully_shard


def step(ctx):
    fully_shard(ctx.model)
