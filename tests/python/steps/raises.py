# Raises on rank 1 at step 0; every other rank trains as the baseline would.
import full_finetune


def step(ctx):
    if ctx.rank == ctx.world_size - 1:
        raise ValueError("the step rejects rank %d" % ctx.rank)  # line 7
    return full_finetune.step(ctx)
