"""torchtune's full fine-tuning step, as a gradnorm Python step (the "baseline").

One optimizer step of full_finetune_single_device on one rank and of
full_finetune_distributed on more, written the way the recipes write it
(torchtune@bd2a0fc7 recipes/full_finetune_single_device.py:609-645,
recipes/full_finetune_distributed.py:1004-1069):

    gradnorm run --python-step examples/python/full_finetune.py \\
        --name py/baseline --findings-of baseline

Python's own arithmetic decides the bits here: `world_size / num_tokens` on an int64 tensor
is torch's `num_tokens.reciprocal() * world_size`, which the C++ transcription matches.
"""

import torch
import torch.distributed as dist

IGNORE_INDEX = -100


def cannot_run(scenario):
    """The scenarios this transcription does not cover (gradnorm leaves them out)."""
    if scenario["optimizer_in_backward"]:
        return "transcribes the recipes' usual path; optimizer in backward is not transcribed"
    return None


def clips(ctx):
    if ctx.world_size == 1:
        return bool(ctx.max_norm)  # single device: `if self._clip_grad_norm:`
    return ctx.max_norm is not None  # distributed: `is not None`


def backward_token_sums(ctx):
    """Each micro-batch's mean loss times its token count, backwarded: a token sum."""
    num_tokens = 0
    running_loss = 0
    for batch in ctx.micro_batches:
        current_num_tokens = (batch["labels"] != IGNORE_INDEX).sum()
        num_tokens += current_num_tokens
        logits = ctx.model(batch["tokens"])
        current_loss = ctx.loss_fn(logits, batch["labels"]) * current_num_tokens
        running_loss += current_loss.detach()
        current_loss.backward()
    return num_tokens, running_loss


def scale_grads_(parameters, scaler):
    with torch.no_grad():
        for p in parameters:
            if p.grad is not None:
                p.grad *= scaler


def clip_and_step(ctx):
    grad_norm = None
    if clips(ctx):
        grad_norm = torch.nn.utils.clip_grad_norm_(ctx.model.parameters(),
                                                   max_norm=float(ctx.max_norm))
    ctx.optimizer.step()
    ctx.optimizer.zero_grad(set_to_none=True)
    return grad_norm


def step(ctx):
    num_tokens, running_loss = backward_token_sums(ctx)
    if ctx.world_size == 1:
        scale_grads_(ctx.model.parameters(), 1.0 / num_tokens)
        grad_norm = clip_and_step(ctx)
        return {"loss_to_log": (running_loss / num_tokens).item(), "grad_norm": grad_norm}
    # FSDP averages the gradients inside backward; the harness's model is not sharded, so
    # the step asks for the same average once the window's backward passes are done.
    ctx.average_gradients()
    dist.all_reduce(num_tokens)
    dist.all_reduce(running_loss)
    scale_grads_(ctx.model.parameters(), ctx.world_size / num_tokens)
    grad_norm = clip_and_step(ctx)
    return {"loss_to_log": running_loss.item() / num_tokens, "grad_norm": grad_norm}
