"""The pull request's skip, as a gradnorm Python step.

With one micro-batch per step and no optimizer in backward, the pull request backwards
each micro-batch's mean loss and drops the scale_grads_ pass; everywhere else the recipe
runs unchanged (examples/python/full_finetune.py):

    gradnorm run --python-step examples/python/skip.py --name py/skip --findings-of skip
"""

import torch.distributed as dist

import full_finetune  # the recipe it changes, from the same folder

cannot_run = full_finetune.cannot_run


def gate_open(ctx):
    return ctx.scenario["accumulation_steps"] == 1 and not ctx.scenario["optimizer_in_backward"]


def step(ctx):
    if not gate_open(ctx):
        return full_finetune.step(ctx)
    num_tokens = 0
    running_loss = 0
    for batch in ctx.micro_batches:
        num_tokens += (batch["labels"] != full_finetune.IGNORE_INDEX).sum()
        loss = ctx.loss_fn(ctx.model(batch["tokens"]), batch["labels"])
        running_loss += loss.detach()
        loss.backward()
    ctx.average_gradients()  # FSDP's average (see full_finetune.step)
    if ctx.world_size > 1:
        dist.all_reduce(num_tokens)
        dist.all_reduce(running_loss)
    grad_norm = full_finetune.clip_and_step(ctx)
    return {"loss_to_log": running_loss.item() / ctx.world_size, "grad_norm": grad_norm}
