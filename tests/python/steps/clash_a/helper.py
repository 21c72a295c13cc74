def step(ctx):
    ctx.optimizer.step()
    return {"loss_to_log": 1.0}
