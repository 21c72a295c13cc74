"""examples/lightning/mean_loss.py written against the pytorch_lightning name, as older code
imports it: gradnorm runs pytorch_lightning's Trainer for it."""

import torch.nn.functional as F
import pytorch_lightning as pl


class PlMeanLoss(pl.LightningModule):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def training_step(self, batch, batch_idx):
        logits = self.model(batch["input_ids"])[:, :-1]
        labels = batch["labels"][:, 1:]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                               ignore_index=-100)
        self.log("loss", loss)
        return loss
