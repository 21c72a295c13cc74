"""torchtune's full_finetune_distributed step with the model sharded by FSDP2's fully_shard.

The same arithmetic as full_finetune.py (token sums per micro-batch, the window's token count
all-reduced, gradients scaled by world_size / num_tokens), but the rank average is FSDP2's
own: fully_shard replaces the parameters by DTensor shards, all-gathers them around the
forward and reduce-scatters (averages) the gradients in the backward, over the real Gloo
process group of gradnorm's rank processes. It needs a model whose forward is its own Python,
so a scenario's model = "python:FILE.py:FUNCTION", and ranks as processes:

    gradnorm run --nproc 2 -f examples/python/models.toml -s 'pymodel/5-3' \\
        --python-step examples/python/fsdp2.py
"""

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

IGNORE_INDEX = -100


def cannot_run(scenario):
    if scenario["world_size"] == 1:
        return "shards the model with fully_shard: needs two or more rank processes"
    if scenario["model"] != "python":
        return "fully_shard needs a model whose forward is its own Python (model = \"python:...\")"
    if scenario["optimizer_in_backward"]:
        return "steps the optimizer after backward; optimizer in backward is not covered"
    if scenario["tp"] > 1 or scenario["cp"] > 1 or scenario["dp_replicate"] > 1:
        return "FSDP over the whole world: meshes (tp, cp, dp_replicate) are not covered"
    return None


def step(ctx, scale=True):
    """One optimizer step. scale=False leaves the gradients as token sums (the bug a dropped
    scale pass makes), for tests that prove gradnorm sees through the shards."""
    if "sharded" not in ctx.state:
        fully_shard(ctx.model)  # once per run; the parameters become DTensor shards
        ctx.state["sharded"] = True
    num_tokens = 0
    running_loss = 0
    for batch in ctx.micro_batches:
        current_num_tokens = (batch["labels"] != IGNORE_INDEX).sum()
        num_tokens += current_num_tokens
        logits = ctx.model(batch["tokens"])
        current_loss = ctx.loss_fn(logits, batch["labels"]) * current_num_tokens
        running_loss += current_loss.detach()
        current_loss.backward()
    dist.all_reduce(num_tokens)
    dist.all_reduce(running_loss)
    if scale:
        with torch.no_grad():
            for p in ctx.model.parameters():
                if p.grad is not None:
                    p.grad *= ctx.world_size / num_tokens
    grad_norm = None
    if ctx.max_norm is not None:
        grad_norm = torch.nn.utils.clip_grad_norm_(ctx.model.parameters(),
                                                   max_norm=float(ctx.max_norm))
        grad_norm = grad_norm.full_tensor()
    ctx.optimizer.step()
    ctx.optimizer.zero_grad(set_to_none=True)
    return {"loss_to_log": (running_loss / num_tokens).item(), "grad_norm": grad_norm}
