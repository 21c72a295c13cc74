"""A user's own Trainer code, judged as it is written:

    gradnorm run --recipe transformers:examples/transformers/my_trainer.py:NAME -s 'single/*'

NAME is a Trainer subclass, or a function Trainer takes as its compute_loss_func.
"""

import torch
from transformers import Trainer

IGNORE_INDEX = -100


def _token_losses(outputs, labels, reduction):
    # A causal LM's logits at position t predict the label at t + 1 (labels are aligned with
    # input_ids, as Trainer's datasets give them).
    logits = outputs.logits[:, :-1, :].float()
    target = labels[:, 1:].to(logits.device)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                             target.reshape(-1), ignore_index=IGNORE_INDEX,
                                             reduction=reduction)


def summed_token_loss(outputs, labels, num_items_in_batch=None):
    """A compute_loss_func: the micro-batch's token losses summed, over Trainer's count of the
    window's tokens."""
    return _token_losses(outputs, labels, "sum") / num_items_in_batch


def mean_token_loss(outputs, labels, num_items_in_batch=None):
    """A compute_loss_func that ignores num_items_in_batch: each micro-batch's own token mean."""
    return _token_losses(outputs, labels, "mean")


class SkipEmptyMicroBatches(Trainer):
    """Skips a micro-batch with no loss-visible token (the seed pull request's idea, in a
    Trainer subclass): its forward and backward would only add zeros."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        if int((inputs["labels"][:, 1:] != IGNORE_INDEX).sum()) == 0:
            return torch.zeros((), device=self.args.device)
        return super().training_step(model, inputs, num_items_in_batch)
