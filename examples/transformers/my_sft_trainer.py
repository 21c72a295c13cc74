"""A user's own TRL SFTTrainer subclasses, judged as they are written:

    PYTHONPATH=.venv/trl-1.16.0 gradnorm run --recipe trl:examples/transformers/my_sft_trainer.py:NAME

or as the variants of examples/transformers/my_sft_trainer.toml.
"""

from trl import SFTTrainer


class CountsValidTokens(SFTTrainer):
    """Keeps a running count of the loss-visible tokens it trained on (for its own logs), and
    otherwise computes the loss as SFTTrainer does."""

    valid_tokens = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.valid_tokens += int((inputs["labels"][:, 1:] != -100).sum())
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


class MeanPerMicroBatch(SFTTrainer):
    """Normalises each micro-batch by its own tokens: it drops the window's token count that
    Trainer passes (num_items_in_batch), as a loss written for one micro-batch would."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch=None)
