"""DeepSpeed loops for tests/python/deepspeed_loops.sh: examples/deepspeed/token_loss.py's train
with one duty done wrong on purpose, by the loop or by a DeepSpeed engine patched at test time
(each a negative control gradnorm must judge wrong)."""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "deepspeed"))
from token_loss import train  # noqa: E402


class _Reversed(torch.nn.Module):
    def __init__(self, engine):
        super().__init__()
        self.engine = engine

    def __call__(self, input_ids):
        return self.engine(input_ids.flip(-1))

    def __getattr__(self, name):
        if name == "engine":
            return super().__getattr__(name)
        return getattr(self.engine, name)


def feeds_reversed(engine, dataloader):
    """Trains on its micro-batches' tokens reversed."""
    train(_Reversed(engine), dataloader)


def logs_elsewhere(engine, dataloader):
    """Writes its loss to the monitor under another name: nothing under Train/Samples/train_loss."""
    write = engine.monitor.write_events
    engine.monitor.write_events = lambda events: write([("Train/Samples/loss",) + tuple(e[1:])
                                                        for e in events])
    train(engine, dataloader)


def engine_skips_clipping(engine, dataloader):
    """A DeepSpeed whose engine never clips: ZeRO 0's clip_fp32_gradients and ZeRO 1 and 2's
    unscale_and_clip_grads do nothing (fp32: no loss scale to undo)."""
    if engine.zero_optimization_stage() == 0:
        engine.clip_fp32_gradients = lambda: None
    else:
        engine.optimizer.unscale_and_clip_grads = lambda grad_groups_flat, total_norm: None
    train(engine, dataloader)


def rank1_partition_zeroed(engine, dataloader):
    """A DeepSpeed whose ZeRO optimizer loses rank 1's partition of the gradient before the
    step: every rank's update is then wrong where rank 1 owns the parameters."""
    clip = engine.optimizer.unscale_and_clip_grads

    def lose(grad_groups_flat, total_norm):
        clip(grad_groups_flat, total_norm)
        if engine.global_rank == 1:
            for grad in grad_groups_flat:
                grad.zero_()
    engine.optimizer.unscale_and_clip_grads = lose
    train(engine, dataloader)


def engine_forgets_zero_grad(engine, dataloader):
    """A DeepSpeed whose engine zeroes no gradient after a ZeRO 0 step: each step's pile onto
    the last's. (ZeRO 1 and 2 free the model's gradients in their own reduction, whatever
    zero_grad does: runtime/zero/stage_1_and_2.py, _clear_param_grad_only.)"""
    engine.zero_grad = lambda *args, **kwargs: None
    train(engine, dataloader)
