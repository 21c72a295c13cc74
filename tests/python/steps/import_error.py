import a_module_nobody_installed  # line 1


def step(ctx):
    return None
