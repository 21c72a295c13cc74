# What a recipe asks of torch.distributed, checked from inside a step.
import torch
import torch.distributed as dist


def step(ctx):
    assert dist.is_initialized()
    assert dist.get_world_size() == ctx.world_size, (dist.get_world_size(), ctx.world_size)
    assert dist.get_rank() == ctx.rank, (dist.get_rank(), ctx.rank)
    value = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(value)
    assert value.item() == ctx.world_size * (ctx.world_size + 1) / 2, value
    dist.barrier()
    try:
        dist.all_reduce(torch.ones(1), op=dist.ReduceOp.MAX)
    except RuntimeError as error:
        assert "ReduceOp.SUM only" in str(error), error
    else:
        raise AssertionError("MAX was accepted")
    # The model's parameters are the harness's own tensors: the names it uses, in order.
    names = [name for name, _ in ctx.model.named_parameters()]
    assert names and all("." in n for n in names), names
    return None
