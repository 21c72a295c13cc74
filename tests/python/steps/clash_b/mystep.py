import helper


def step(ctx):
    return helper.step(ctx)
