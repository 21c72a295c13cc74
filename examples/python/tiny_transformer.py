"""A model from a Python file: one pre-norm transformer block with causal self-attention
(torch's scaled_dot_product_attention), written as any torch.nn.Module is. A scenario names
it as

    model = "python:tiny_transformer.py:tiny_transformer"

and gradnorm calls tiny_transformer(vocab_size=..., hidden_size=..., sequence_length=...)
with the scenario's sizes, trains the module it returns in the scenario's dtype on every
rank, and runs a float64 copy of the same initial parameters as the oracle:

    gradnorm run -f examples/python/models.toml -v baseline -v skip
"""

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, hidden_size, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden_size)
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size, bias=False)
        self.proj = nn.Linear(hidden_size, hidden_size)
        self.norm2 = nn.LayerNorm(hidden_size)
        self.mlp = nn.Sequential(nn.Linear(hidden_size, 2 * hidden_size), nn.GELU(),
                                 nn.Linear(2 * hidden_size, hidden_size))

    def forward(self, x):
        b, t, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(h, dim=-1)
        q, k, v = (z.view(b, t, self.heads, h // self.heads).transpose(1, 2) for z in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, h))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab_size, hidden_size, sequence_length, heads=2):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden_size)
        self.position = nn.Parameter(0.02 * torch.randn(sequence_length, hidden_size))
        self.block = Block(hidden_size, heads)
        self.norm = nn.LayerNorm(hidden_size)
        self.head = nn.Linear(hidden_size, vocab_size, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        return self.head(self.norm(self.block(x)))


def tiny_transformer(vocab_size, hidden_size, sequence_length):
    heads = 2 if hidden_size % 2 == 0 else 1
    return TinyTransformer(vocab_size, hidden_size, sequence_length, heads)
