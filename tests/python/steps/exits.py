import os


def step(ctx):
    os._exit(0)
