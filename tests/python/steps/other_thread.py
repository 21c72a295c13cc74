# Uses ctx.model from a thread of its own: the harness must refuse it, not crash.
import threading

import full_finetune


def step(ctx):
    seen = []

    def use():
        try:
            ctx.model(ctx.micro_batches[0]["tokens"])
            seen.append("no error")
        except RuntimeError as error:
            seen.append(str(error))

    thread = threading.Thread(target=use)
    thread.start()
    thread.join()
    if "another thread" not in seen[0]:
        raise AssertionError(seen[0])
    return full_finetune.step(ctx)
