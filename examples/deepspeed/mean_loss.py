"""The training loop of DeepSpeed's getting-started guide, written here from its description:
for each micro-batch, the engine's forward, the micro-batch's mean cross-entropy handed to
`engine.backward` (which divides it by the config's gradient_accumulation_steps) and
`engine.step()` (which steps the optimizer on the window's last micro-batch only, clipping to the
config's gradient_clipping first). The window's mean loss is written to the engine's monitor
after its step. gradnorm calls train(engine, dataloader):

    gradnorm run --recipe deepspeed:examples/deepspeed/mean_loss.py:train --nproc 2 -s 'dist/*'
    gradnorm run --recipe deepspeed:examples/deepspeed/mean_loss.py:train --nproc 2 \
        --recipe-arg zero_optimization.stage=2 -s 'dist/*'
"""

import torch.nn.functional as F


def train(engine, dataloader):
    window = []
    for batch in dataloader:
        logits = engine(batch["input_ids"])[:, :-1]
        labels = batch["labels"][:, 1:]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                               ignore_index=-100)
        engine.backward(loss)
        window.append(loss.item())
        boundary = engine.is_gradient_accumulation_boundary()
        engine.step()
        if boundary:
            engine.monitor.write_events([("Train/Samples/train_loss", sum(window) / len(window),
                                          engine.global_samples)])
            window = []
