"""Two training loops on Lightning Fabric, as gradnorm calls them (docs/frameworks.md, "Lightning
Fabric"): FUNCTION(fabric, model, optimizer, dataloader, accumulation_steps, max_grad_norm).

mean_loop is the loop of Fabric's gradient-accumulation guide: each micro-batch's mean loss,
divided by the accumulation steps, gradients synchronised only on the window's last
micro-batch (no_backward_sync). token_loop backpropagates token sums and, before clipping,
divides the gradients by the window's token count summed over ranks (times W, since DDP
averages the ranks' gradients).

    gradnorm run --recipe fabric:examples/fabric/loops.py:mean_loop -s single/accum2-ragged/float32
    gradnorm run --recipe fabric:examples/fabric/loops.py:token_loop --nproc 2 -s 'dist/*'
"""

import torch
import torch.nn.functional as F


def _shifted(model, batch):
    logits = model(batch["input_ids"])[:, :-1]
    labels = batch["labels"][:, 1:]
    return logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)


def mean_loop(fabric, model, optimizer, dataloader, accumulation_steps, max_grad_norm):
    model, optimizer = fabric.setup(model, optimizer)
    dataloader = fabric.setup_dataloaders(dataloader)
    window = []
    for index, batch in enumerate(dataloader):
        stepping = (index + 1) % accumulation_steps == 0
        with fabric.no_backward_sync(model, enabled=not stepping):
            loss = F.cross_entropy(*_shifted(model, batch), ignore_index=-100)
            fabric.backward(loss / accumulation_steps)
        window.append(loss.detach())
        if stepping:
            if max_grad_norm is not None:
                fabric.clip_gradients(model, optimizer, max_norm=max_grad_norm)
            optimizer.step()
            optimizer.zero_grad()
            fabric.log("loss", torch.stack(window).mean())
            window = []


def token_loop(fabric, model, optimizer, dataloader, accumulation_steps, max_grad_norm):
    model, optimizer = fabric.setup(model, optimizer)
    dataloader = fabric.setup_dataloaders(dataloader)
    tokens, loss_sum = 0, 0.0
    for index, batch in enumerate(dataloader):
        stepping = (index + 1) % accumulation_steps == 0
        with fabric.no_backward_sync(model, enabled=not stepping):
            logits, labels = _shifted(model, batch)
            summed = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
            fabric.backward(summed)
        tokens += int((labels != -100).sum())
        loss_sum += float(summed.detach())
        if stepping:
            totals = fabric.all_reduce(torch.tensor([float(tokens), loss_sum], dtype=torch.float64),
                                       reduce_op="sum")
            if float(totals[0]) > 0:
                for p in model.parameters():
                    if p.grad is not None:
                        p.grad.mul_(fabric.world_size / float(totals[0]))
            if max_grad_norm is not None:
                fabric.clip_gradients(model, optimizer, max_norm=max_grad_norm)
            optimizer.step()
            optimizer.zero_grad()
            fabric.log("loss", float(totals[1]) / float(totals[0]) if float(totals[0]) > 0 else float("nan"))
            tokens, loss_sum = 0, 0.0
