"""A LightningModule that normalises by the valid tokens of the whole accumulation window and of
every rank, as the fix proposed for Lightning's gradient accumulation does (each micro-batch's
loss weighed by the window's token count, not averaged per micro-batch). Written from the
module's side, with Lightning's own hooks and nothing patched:

* training_step returns the micro-batch's token SUM of cross-entropy, times
  accumulate_grad_batches, so that Lightning's division of each micro-batch's loss by
  accumulate_grad_batches leaves the sums; it counts the valid tokens it saw;
* on_before_optimizer_step (Lightning calls it after the window's last backward and before
  clipping) sums the token count over ranks with the strategy's own reduce, and scales the
  gradients by W / N: DDP averaged the ranks' sums, so this makes them the token mean over the
  window and the ranks; it logs that mean as ``loss``.

    gradnorm run --recipe lightning:examples/lightning/token_normalised.py:TokenNormalised
    gradnorm run --recipe lightning:examples/lightning/token_normalised.py:TokenNormalised \
        --nproc 2 -s 'dist/*'
"""

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule


class TokenNormalised(LightningModule):
    def __init__(self, model):
        super().__init__()
        self.model = model
        self.window_tokens = 0
        self.window_loss_sum = 0.0

    def training_step(self, batch, batch_idx):
        logits = self.model(batch["input_ids"])
        logits, labels = logits[:, :-1], batch["labels"][:, 1:]
        loss_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                   ignore_index=-100, reduction="sum")
        self.window_tokens += int((labels != -100).sum())
        self.window_loss_sum += float(loss_sum.detach())
        return loss_sum * self.trainer.accumulate_grad_batches

    def on_before_optimizer_step(self, optimizer):
        totals = torch.tensor([float(self.window_tokens), self.window_loss_sum],
                              dtype=torch.float64)
        totals = self.trainer.strategy.reduce(totals, reduce_op="sum")
        tokens, loss_sum = float(totals[0]), float(totals[1])
        self.window_tokens, self.window_loss_sum = 0, 0.0
        if tokens == 0:
            return  # no valid token in the window: the gradients are zero already
        scale = self.trainer.world_size / tokens
        for p in self.parameters():
            if p.grad is not None:
                p.grad.mul_(scale)
        self.log("loss", loss_sum / tokens)
