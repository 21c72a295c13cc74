# Changes torch's global default dtype, as recipes do, then trains as the baseline.
import torch

import full_finetune


def step(ctx):
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    with torch.enable_grad():
        return full_finetune.step(ctx)
