"""The loop of Accelerate's gradient-accumulation guide: `accelerator.accumulate(model)` around
each micro-batch, the micro-batch's mean cross-entropy handed to `accelerator.backward` (which
divides it by the accumulation steps), the optimizer stepped and zeroed inside the context
(accelerate skips both until the window's last micro-batch). gradnorm calls
train(accelerator, model, optimizer, dataloader, max_grad_norm):

    gradnorm run --recipe accelerate:examples/accelerate/mean_loss.py:train -s single/accum2-ragged/float32
    gradnorm run --recipe accelerate:examples/accelerate/mean_loss.py:train --nproc 2 -s 'dist/*'
"""

import torch
import torch.nn.functional as F


def train(accelerator, model, optimizer, dataloader, max_grad_norm):
    model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)
    window = []
    for batch in dataloader:
        with accelerator.accumulate(model):
            logits = model(batch["input_ids"])[:, :-1]
            labels = batch["labels"][:, 1:]
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                   ignore_index=-100)
            accelerator.backward(loss)
            window.append(loss.detach())
            if accelerator.sync_gradients and max_grad_norm is not None:
                accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            accelerator.log({"loss": torch.stack(window).mean().item()})
            window = []
