# The last rank leaves through C's _exit(0), past every Python guard: the run must not read
# as complete.
import ctypes

import full_finetune


def step(ctx):
    if ctx.rank == ctx.world_size - 1:
        ctypes.CDLL(None)._exit(0)
    return full_finetune.step(ctx)
