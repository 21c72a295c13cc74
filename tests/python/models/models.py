"""Models from a Python file for tests/python/python_model_test.cpp: one that trains, and one
for each way such a file can be wrong."""

import torch
from torch import nn


class Mixer(nn.Module):
    """A causal LM without attention: embeddings averaged over the prefix, a tanh layer, a
    head (the built-in causal_lm's shape, written as users write modules)."""

    def __init__(self, vocab_size, hidden_size):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden_size)
        self.hidden = nn.Linear(hidden_size, hidden_size)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(self, tokens):
        x = self.embed(tokens)
        positions = torch.arange(1, tokens.shape[1] + 1, dtype=x.dtype).view(1, -1, 1)
        return self.head(torch.tanh(self.hidden(x.cumsum(1) / positions)))


def mixer(vocab_size, hidden_size, sequence_length):
    return Mixer(vocab_size, hidden_size)


class Output:
    def __init__(self, logits):
        self.logits = logits


class WithOutput(Mixer):
    """Returns an object with .logits, as Hugging Face's models do."""

    def forward(self, tokens):
        return Output(super().forward(tokens))


def with_output(vocab_size, hidden_size, sequence_length):
    return WithOutput(vocab_size, hidden_size)


def frozen_embedding(vocab_size, hidden_size, sequence_length):
    model = Mixer(vocab_size, hidden_size)
    model.embed.weight.requires_grad_(False)
    return model


def upcast_output(vocab_size, hidden_size, sequence_length):
    class Upcast(Mixer):
        def forward(self, tokens):
            return super().forward(tokens).float()
    return Upcast(vocab_size, hidden_size)


# --- wrong ---------------------------------------------------------------------------

def raises(vocab_size, hidden_size, sequence_length):
    raise ValueError("no such size %d" % hidden_size)


def not_a_module(vocab_size, hidden_size, sequence_length):
    return {"embed": torch.zeros(vocab_size, hidden_size)}


def wrong_shape(vocab_size, hidden_size, sequence_length):
    return nn.Sequential(nn.Embedding(vocab_size, hidden_size), nn.Linear(hidden_size, vocab_size + 1))


class IntegerOut(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.vocab_size = vocab_size

    def forward(self, tokens):
        return tokens.unsqueeze(-1).expand(-1, -1, self.vocab_size).clone()


def integer_logits(vocab_size, hidden_size, sequence_length):
    return IntegerOut(vocab_size)


def integer_parameter(vocab_size, hidden_size, sequence_length):
    model = Mixer(vocab_size, hidden_size)
    model.counts = nn.Parameter(torch.zeros(3, dtype=torch.long), requires_grad=False)
    return model


def meta_parameter(vocab_size, hidden_size, sequence_length):
    model = Mixer(vocab_size, hidden_size)
    model.extra = nn.Parameter(torch.zeros(3, device="meta"))  # shapes only: no storage
    return model


def nothing_trainable(vocab_size, hidden_size, sequence_length):
    model = Mixer(vocab_size, hidden_size)
    model.requires_grad_(False)
    return model


def forward_raises(vocab_size, hidden_size, sequence_length):
    class Raising(Mixer):
        def forward(self, tokens):
            raise RuntimeError("this model cannot run")
    return Raising(vocab_size, hidden_size)


def no_keywords(vocab, hidden):
    return Mixer(vocab, hidden)


not_callable = 3


def raises_on_real_tokens(vocab_size, hidden_size, sequence_length):
    """Passes the check on token ids of zeros, then raises on a step's batches."""
    class Picky(Mixer):
        def forward(self, tokens):
            if bool((tokens != 0).any()):
                raise ValueError("token ids above 0 are not supported")
            return super().forward(tokens)
    return Picky(vocab_size, hidden_size)
