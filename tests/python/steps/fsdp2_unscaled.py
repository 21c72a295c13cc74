"""examples/python/fsdp2.py without its scale pass: the gradients FSDP2 reduce-scatters stay
token sums. A negative control: gradnorm must read them through the DTensor shards and fail
the step. Also checks that fully_shard keeps its attributes inside gradnorm."""

import fsdp2
from torch.distributed.fsdp import FSDPModule, fully_shard

cannot_run = fsdp2.cannot_run


def step(ctx):
    result = fsdp2.step(ctx, scale=False)
    if not isinstance(ctx.model, FSDPModule) or fully_shard.state(ctx.model) is None:
        raise TypeError("fully_shard did not shard ctx.model, or lost fully_shard.state")
    return result
