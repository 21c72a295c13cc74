class Unprintable(Exception):
    def __str__(self):
        raise ValueError("no str")


def step(ctx):
    if ctx.scenario["name"].startswith("dist/"):
        raise Unprintable()
    raise ValueError("bad \ud800 text")
