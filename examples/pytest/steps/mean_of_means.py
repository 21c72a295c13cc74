"""A step with the classic gradient-accumulation bug, on purpose: each micro-batch's mean loss,
divided by the number of micro-batches. Right when every micro-batch holds as many tokens as the
others; wrong when they differ (a token of a short micro-batch weighs more)."""


def step(ctx):
    micro_batches = list(ctx.micro_batches)
    running = 0.0
    for batch in micro_batches:
        loss = ctx.loss_fn(ctx.model(batch["tokens"]), batch["labels"]) / len(micro_batches)
        running += loss.item()
        loss.backward()
    ctx.optimizer.step()
    ctx.optimizer.zero_grad(set_to_none=True)
    return {"loss_to_log": running}
