"""The token-level loop of Accelerate's guide "gradient accumulation on training samples of
variable size", written here from its description: take the window's micro-batches first, count
their valid tokens, sum that count over the processes (`accelerator.gather`), and give
`accelerator.backward` each micro-batch's token SUM over that count, times the accumulation
steps and the number of processes (accelerate divides by the first, DDP averages over the
second), so that the window's gradient is the token mean over the window and the ranks. As in
the guide, the window is driven by hand: gradients are synchronised on its last micro-batch only
(`no_sync` before it) and the optimizer steps once after it; `accelerator.accumulate`, which
decides from its own counter and the end of the dataloader, is not used.

    gradnorm run --recipe accelerate:examples/accelerate/token_loss.py:train -s single/accum2-ragged/float32
    gradnorm run --recipe accelerate:examples/accelerate/token_loss.py:train --nproc 2 -s 'dist/*'
"""

import contextlib

import torch
import torch.nn.functional as F


def train(accelerator, model, optimizer, dataloader, max_grad_norm):
    model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)
    steps = accelerator.gradient_accumulation_steps
    batches = iter(dataloader)
    while True:
        window = [batch for _, batch in zip(range(steps), batches)]
        if not window:
            return
        tokens = sum(int((b["labels"][:, 1:] != -100).sum()) for b in window)
        tokens = accelerator.gather(torch.tensor([tokens])).sum().item()
        loss_sum = 0.0
        for i, batch in enumerate(window):
            last = i == len(window) - 1
            quiet = model.no_sync if not last and accelerator.num_processes > 1 else contextlib.nullcontext
            with quiet():
                logits = model(batch["input_ids"])[:, :-1]
                labels = batch["labels"][:, 1:]
                summed = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                         ignore_index=-100, reduction="sum")
                loss_sum += summed.item()
                accelerator.backward(summed * steps * accelerator.num_processes / max(tokens, 1))
        if max_grad_norm is not None:
            accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        total = accelerator.gather(torch.tensor([loss_sum], dtype=torch.float64)).sum().item()
        accelerator.log({"loss": total / tokens if tokens else float("nan")})
