"""LightningModules for tests/python/lightning_trainer.sh: copies of examples/lightning/mean_loss.py
that get one duty wrong on purpose, patched at test time through Lightning's own hooks (each a
negative control gradnorm must judge wrong), and the same module written against the
pytorch_lightning name."""

import sys
import os

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "lightning"))
from mean_loss import MeanLoss  # noqa: E402


class ForgetsZeroGrad(MeanLoss):
    """Lightning's zero_grad skipped (optimizer_zero_grad is the module's hook for it): each
    step's gradients pile onto the last step's."""

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        pass


class FeedsReversed(MeanLoss):
    """Trains on its micro-batches' tokens reversed: not what the scenario gave the rank."""

    def training_step(self, batch, batch_idx):
        batch = dict(batch, input_ids=batch["input_ids"].flip(-1))
        return super().training_step(batch, batch_idx)


class SkipsLog(MeanLoss):
    """Logs its loss under another name: nothing logged under "loss"."""

    def log(self, name, value, *args, **kwargs):
        super().log("train_" + name, value, *args, **kwargs)


class LogsDoubled(MeanLoss):
    """Logs twice the loss it trains on."""

    def log(self, name, value, *args, **kwargs):
        super().log(name, 2 * value, *args, **kwargs)


class ClipsTwice(MeanLoss):
    """Clips to a tenth of the norm Lightning was given (configure_gradient_clipping is the
    module's hook for clipping)."""

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None,
                                    gradient_clip_algorithm=None):
        if gradient_clip_val:
            torch.nn.utils.clip_grad_norm_(self.parameters(), gradient_clip_val / 10)


class NotAModule(torch.nn.Module):
    pass


def not_a_class(model):
    return MeanLoss(model)
