# A deliberately broken step: each rank normalises by its own token count (a mean of means
# across ranks), the bug the pull request's skip has on ragged ranks.
import torch
import torch.distributed as dist


def step(ctx):
    running = 0
    for batch in ctx.micro_batches:
        loss = ctx.loss_fn(ctx.model(batch["tokens"]), batch["labels"])
        running += loss.detach()
        loss.backward()
    ctx.average_gradients()
    dist.all_reduce(running)
    ctx.optimizer.step()
    ctx.optimizer.zero_grad(set_to_none=True)
    return {"loss_to_log": running / ctx.world_size}
