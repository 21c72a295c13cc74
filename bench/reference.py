"""The same per-case check as `gradnorm run -f STREAM -v baseline -v skip`, written as a
straightforward PyTorch script: the yardstick of gradnorm's speed figures (README, "Speed").

For every case of a stream file (`gradnorm stream --cases N --seed S --out FILE`): a float64
oracle, the recipe's baseline and the pull request's skip on every rank and micro-batch of a
similar tiny causal LM (float32, SGD, no clipping), each compared with the oracle by relative
L2 error of the gradients, the parameters after the step and the logged loss, and a verdict.

    /usr/bin/python3 bench/reference.py FILE
"""

import sys
import tomllib

import torch
import torch.nn.functional as F

torch.set_num_threads(1)

TOLERANCE = 1e-5  # float32 against float64, as gradnorm's float32 tolerance


def draw_model(generator, vocab, hidden):
    shapes = {"embedding": (vocab, hidden), "hidden_w": (hidden, hidden), "hidden_b": (hidden,),
              "head_w": (vocab, hidden), "head_b": (vocab,)}
    scales = {"embedding": 1.0, "hidden_w": hidden ** -0.5, "hidden_b": 0.1,
              "head_w": hidden ** -0.5, "head_b": 0.1}
    return {name: torch.randn(shape, generator=generator, dtype=torch.float64) * scales[name]
            for name, shape in shapes.items()}


def draw_batch(generator, vocab, length, count):
    tokens = torch.randint(vocab, (1, length), generator=generator)
    labels = torch.full((1, length), -100, dtype=torch.long)
    positions = torch.randperm(length - 1, generator=generator)[:count]
    labels[0, positions] = torch.randint(vocab, (count,), generator=generator)
    return tokens, labels


def logits_of(params, tokens):
    embedded = params["embedding"][tokens]
    counts = torch.arange(1, tokens.size(1) + 1, dtype=embedded.dtype).view(1, -1, 1)
    hidden = torch.tanh(F.linear(embedded.cumsum(1) / counts, params["hidden_w"], params["hidden_b"]))
    return F.linear(hidden, params["head_w"], params["head_b"])


def fresh(params, dtype):
    return {name: value.to(dtype).clone().requires_grad_(True) for name, value in params.items()}


def token_sum(params, tokens, labels):
    logits = logits_of(params, tokens).float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1),
                           ignore_index=-100, reduction="sum")


def oracle(params, batches, lr):
    p64 = fresh(params, torch.float64)
    total = sum((labels != -100).sum() for rank in batches for _, labels in rank)
    loss = 0
    for rank in batches:
        for tokens, labels in rank:
            logits = logits_of(p64, tokens)
            loss = loss + F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1),
                                          ignore_index=-100, reduction="sum")
    loss = loss / total
    loss.backward()
    grads = {n: p.grad for n, p in p64.items()}
    after = {n: p.detach() - lr * grads[n] for n, p in p64.items()}
    return grads, after, float(loss)


def run_ranks(params, batches, lr, skip):
    """Every rank on its own replica; gradients averaged over ranks as FSDP does."""
    world = len(batches)
    skip = skip and len(batches[0]) == 1  # the pull request's gate: no accumulation
    rank_grads, running, tokens_seen = [], 0.0, 0
    for rank in batches:
        p = fresh(params, torch.float32)
        for tokens, labels in rank:
            n = (labels != -100).sum()
            mean = token_sum(p, tokens, labels) / n
            (mean if skip else mean * n).backward()
            running += float(mean.detach()) if skip else float(mean.detach() * n)
            tokens_seen += int(n)
        rank_grads.append({name: t.grad if t.grad is not None else torch.zeros_like(t)
                           for name, t in p.items()})
    grads = {name: sum(g[name] for g in rank_grads) / world for name in params}
    if skip:
        logged = running / world
    else:
        grads = {name: g * (world / tokens_seen) for name, g in grads.items()}
        logged = running / tokens_seen
    after = {name: params[name].float() - lr * g for name, g in grads.items()}
    return grads, after, logged


def rel_l2(got, want):
    got = torch.cat([got[n].double().reshape(-1) for n in sorted(want)])
    want = torch.cat([want[n].reshape(-1) for n in sorted(want)])
    return float((got - want).norm() / want.norm())


def check(case):
    counts = case["valid_tokens"]
    vocab, hidden, length, lr = case["vocab_size"], case["hidden_size"], case["sequence_length"], 0.5
    generator = torch.Generator().manual_seed(case["seed"])
    params = draw_model(generator, vocab, hidden)
    batches = [[draw_batch(generator, vocab, length, c) for c in rank] for rank in counts]
    want_grads, want_after, want_loss = oracle(params, batches, lr)
    verdicts = []
    for skip in (False, True):
        grads, after, logged = run_ranks(params, batches, lr, skip)
        errors = (rel_l2(grads, want_grads), rel_l2(after, want_after),
                  abs(logged - want_loss) / abs(want_loss))
        verdicts.append("pass" if all(e <= TOLERANCE for e in errors) else "fail")
    return verdicts


def main(path):
    with open(path, "rb") as f:
        cases = tomllib.load(f)["scenario"]
    tally = {"pass": 0, "fail": 0}
    for case in cases:
        for verdict in check(case):
            tally[verdict] += 1
    print("%d rows: %d pass, %d fail" % (2 * len(cases), tally["pass"], tally["fail"]))


if __name__ == "__main__":
    main(sys.argv[1])
