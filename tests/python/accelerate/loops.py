"""Accelerate loops for tests/python/accelerate_loops.sh: examples/accelerate/token_loss.py's
train with one duty done wrong on purpose, patched at test time (each a negative control
gradnorm must judge wrong)."""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "accelerate"))
from token_loss import train  # noqa: E402


def forgets_zero_grad(accelerator, model, optimizer, dataloader, max_grad_norm):
    """The optimizer accelerate prepares zeroes nothing: each step's gradients pile onto the
    last's."""
    prepare = accelerator.prepare

    def prepare_then_forget(*objects):
        prepared = prepare(*objects)
        for thing in prepared:
            if isinstance(thing, torch.optim.Optimizer):
                thing.zero_grad = lambda *args, **kwargs: None
        return prepared
    accelerator.prepare = prepare_then_forget
    train(accelerator, model, optimizer, dataloader, max_grad_norm)


class _Reversed(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids.flip(-1))


def feeds_reversed(accelerator, model, optimizer, dataloader, max_grad_norm):
    """Trains on its micro-batches' tokens reversed."""
    train(accelerator, _Reversed(model), optimizer, dataloader, max_grad_norm)


def logs_elsewhere(accelerator, model, optimizer, dataloader, max_grad_norm):
    """Logs its loss under another name: nothing logged under "loss"."""
    log = accelerator.log
    accelerator.log = lambda values, *args, **kwargs: log(
        {"train_" + k: v for k, v in values.items()}, *args, **kwargs)
    train(accelerator, model, optimizer, dataloader, max_grad_norm)


def never_clips(accelerator, model, optimizer, dataloader, max_grad_norm):
    """Ignores the clip it is given."""
    train(accelerator, model, optimizer, dataloader, None)


def reports_even_batches(accelerator, model, optimizer, dataloader, max_grad_norm):
    """Trains as token_loss.py does once it has checked that the Accelerator was given
    even_batches=False (--recipe-arg dataloader_config.even_batches=false)."""
    if accelerator.even_batches is not False:
        raise RuntimeError("even_batches is %r, not False" % accelerator.even_batches)
    train(accelerator, model, optimizer, dataloader, max_grad_norm)
