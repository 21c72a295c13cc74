def step(ctx):
    raise ctx.Refusal("this step refuses every scenario")
