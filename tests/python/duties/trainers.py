"""Trainer and SFTTrainer subclasses for tests/python/adapter_duties.sh that forget to zero the
gradients, patched at test time: the model's zero_grad does nothing, so each step's gradients
pile onto the last step's (Trainer calls model.zero_grad() after every optimizer step,
5.18.0 trainer.py:1908). gradnorm must judge them wrong on a scenario of several steps; an
adapter that cleared the framework's gradients itself would hide it."""

from transformers import Trainer


def _forget_zero_grad(model):
    model.zero_grad = lambda *args, **kwargs: None


class TrainerForgetsZeroGrad(Trainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _forget_zero_grad(self.model)


def _sft_class():
    from trl import SFTTrainer

    class SftForgetsZeroGrad(SFTTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            _forget_zero_grad(self.model)
    return SftForgetsZeroGrad


try:
    SftForgetsZeroGrad = _sft_class()
except ImportError:  # TRL is in its own folder, on PYTHONPATH only for the TRL runs
    pass
