def step(ctx):
    return None
