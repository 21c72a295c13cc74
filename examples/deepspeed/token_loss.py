"""A DeepSpeed loop normalised by the window's token count over every rank: the window's
micro-batches are taken first, their valid tokens counted and summed over the ranks
(`deepspeed.comm.all_reduce`), and each micro-batch's token SUM is handed to `engine.backward`
over that count, times the accumulation steps and the ranks (the engine divides by the first
and averages gradients over the second), so that the step's gradient is the token mean over
the window and the ranks. The logged loss is the same token mean of the losses. gradnorm calls
train(engine, dataloader):

    gradnorm run --recipe deepspeed:examples/deepspeed/token_loss.py:train --nproc 2 -s 'dist/*'
"""

import torch
import torch.nn.functional as F

import deepspeed.comm as dist


def train(engine, dataloader):
    steps = engine.gradient_accumulation_steps()
    batches = iter(dataloader)
    while True:
        window = [batch for _, batch in zip(range(steps), batches)]
        if not window:
            return
        tokens = torch.tensor([float(sum(int((b["labels"][:, 1:] != -100).sum()) for b in window))])
        dist.all_reduce(tokens)
        tokens = tokens.item()
        loss_sum = 0.0
        for batch in window:
            logits = engine(batch["input_ids"])[:, :-1]
            labels = batch["labels"][:, 1:]
            summed = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                     ignore_index=-100, reduction="sum")
            loss_sum += summed.item()
            engine.backward(summed * steps * engine.world_size / max(tokens, 1.0))
            engine.step()
        total = torch.tensor([loss_sum], dtype=torch.float64)
        dist.all_reduce(total)
        engine.monitor.write_events([("Train/Samples/train_loss",
                                      total.item() / tokens if tokens else float("nan"),
                                      engine.global_samples)])
