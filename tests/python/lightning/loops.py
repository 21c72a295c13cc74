"""Fabric loops for tests/python/lightning_trainer.sh: examples/fabric/loops.py's token_loop
with one duty done wrong on purpose, patched at test time (each a negative control gradnorm must
judge wrong)."""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "fabric"))
from loops import token_loop  # noqa: E402


def forgets_zero_grad(fabric, model, optimizer, dataloader, accumulation_steps, max_grad_norm):
    """The optimizer Fabric sets up zeroes nothing: each step's gradients pile onto the
    last's."""
    setup = fabric.setup

    def setup_then_forget(*args, **kwargs):
        model, optimizer = setup(*args, **kwargs)
        optimizer.zero_grad = lambda *args, **kwargs: None
        return model, optimizer
    fabric.setup = setup_then_forget
    token_loop(fabric, model, optimizer, dataloader, accumulation_steps, max_grad_norm)


class _Reversed(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids.flip(-1))


def feeds_reversed(fabric, model, optimizer, dataloader, accumulation_steps, max_grad_norm):
    """Trains on its micro-batches' tokens reversed."""
    token_loop(fabric, _Reversed(model), optimizer, dataloader, accumulation_steps, max_grad_norm)


def logs_elsewhere(fabric, model, optimizer, dataloader, accumulation_steps, max_grad_norm):
    """Logs its loss under another name: nothing logged under "loss"."""
    log = fabric.log
    fabric.log = lambda name, value, step=None: log("train_" + name, value, step)
    token_loop(fabric, model, optimizer, dataloader, accumulation_steps, max_grad_norm)


def never_clips(fabric, model, optimizer, dataloader, accumulation_steps, max_grad_norm):
    """Ignores the clip it is given."""
    token_loop(fabric, model, optimizer, dataloader, accumulation_steps, None)
