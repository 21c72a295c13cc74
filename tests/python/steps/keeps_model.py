# Keeps the model past its run: a later call must raise, not reach a freed context.
KEPT = []


def step(ctx):
    if KEPT:
        KEPT[0](ctx.micro_batches[0]["tokens"])  # the previous run's model
    KEPT.append(ctx.model)
    return None
