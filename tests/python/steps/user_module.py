"""The baseline step, after checking that ctx.model is the user's own module (a scenario's
model = "python:FILE.py:FUNCTION"), not gradnorm's wrapper: DDP, FSDP and hooks see the
user's class. Raises TypeError on any other model."""

import full_finetune


def step(ctx):
    name = type(ctx.model).__name__
    if name != "TinyTransformer":
        raise TypeError("ctx.model is a %s, not the scenario's TinyTransformer" % name)
    return full_finetune.step(ctx)
