"""The LightningModule most people write for a causal language model: the mean cross-entropy of
each micro-batch's valid tokens, returned from training_step and logged as ``loss``. Lightning
accumulates gradients over ``accumulate_grad_batches`` micro-batches and averages them over
DDP ranks. Judge it with

    gradnorm run --recipe lightning:examples/lightning/mean_loss.py:MeanLoss
    gradnorm run --recipe lightning:examples/lightning/mean_loss.py:MeanLoss --nproc 2 -s 'dist/*'

What gradnorm found is in docs/findings.md ("PyTorch Lightning").
"""

import torch.nn.functional as F
from lightning.pytorch import LightningModule


class MeanLoss(LightningModule):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def training_step(self, batch, batch_idx):
        logits = self.model(batch["input_ids"])
        # The labels are aligned with input_ids: position t predicts labels[t + 1].
        logits, labels = logits[:, :-1], batch["labels"][:, 1:]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                               ignore_index=-100)
        self.log("loss", loss)
        return loss
