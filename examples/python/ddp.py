"""torchtune's full fine-tuning step with the model wrapped in DistributedDataParallel.

The same arithmetic as full_finetune.py (token sums per micro-batch, the window's token
count all-reduced, gradients scaled by world_size / num_tokens), but the rank average is
DDP's own: its reducer all-reduces the gradient buckets during the window's last backward
(earlier ones run under no_sync), over the real Gloo process group gradnorm's rank
processes share with it. Ranks as processes only (ranks as threads have no process group):

    gradnorm run --nproc 2 -s 'dist/5-3/*' --python-step examples/python/ddp.py
"""

import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

IGNORE_INDEX = -100


def cannot_run(scenario):
    if scenario["world_size"] == 1:
        return "wraps the model in DistributedDataParallel: needs two or more rank processes"
    if scenario["optimizer_in_backward"]:
        return "steps the optimizer after backward; optimizer in backward is not covered"
    if scenario["tp"] > 1 or scenario["cp"] > 1 or scenario["dp_replicate"] > 1:
        return "DDP over the whole world: meshes (tp, cp, dp_replicate) are not covered"
    return None


def step(ctx):
    if "ddp" not in ctx.state:
        # Built once per run: DDP broadcasts rank 0's parameters (the same on every rank here).
        ctx.state["ddp"] = DistributedDataParallel(ctx.model)
    model = ctx.state["ddp"]
    num_tokens = 0
    running_loss = 0
    last = len(ctx.micro_batches) - 1
    for index, batch in enumerate(ctx.micro_batches):
        current_num_tokens = (batch["labels"] != IGNORE_INDEX).sum()
        num_tokens += current_num_tokens
        # Gradients are averaged once, in the window's last backward.
        sync = contextlib.nullcontext() if index == last else model.no_sync()
        with sync:
            logits = model(batch["tokens"])
            current_loss = ctx.loss_fn(logits, batch["labels"]) * current_num_tokens
            running_loss += current_loss.detach()
            current_loss.backward()
    dist.all_reduce(num_tokens)
    dist.all_reduce(running_loss)
    with torch.no_grad():
        for p in ctx.model.parameters():
            if p.grad is not None:
                p.grad *= ctx.world_size / num_tokens
    grad_norm = None
    if ctx.max_norm is not None:
        grad_norm = torch.nn.utils.clip_grad_norm_(ctx.model.parameters(),
                                                   max_norm=float(ctx.max_norm))
    ctx.optimizer.step()
    ctx.optimizer.zero_grad(set_to_none=True)
    return {"loss_to_log": running_loss.item() / num_tokens, "grad_norm": grad_norm}
