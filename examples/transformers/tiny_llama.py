"""Hugging Face Transformers' own Llama causal LM, built from a tiny config with random
weights (nothing is downloaded), as a gradnorm model (model = "python:tiny_llama.py:FUNCTION"; the report names
its scenarios FUNCTION/SCENARIO):
two layers, grouped-query attention with rotary embeddings, RMSNorm, SwiGLU, sized by the
scenario. The harness seeds torch before calling a model function, so the weights are the
scenario's.

    gradnorm run --recipe transformers:trainer -s 'single/*'

`hf_tiny_llama` is LlamaForCausalLM itself: its forward takes **kwargs, so Trainer passes it
`num_items_in_batch` (trainer.py's model_accepts_loss_kwargs). `hf_tiny_llama_no_loss_kwargs`
is the same model whose forward names its arguments and takes no keyword arguments beyond
them, as many users' own models do: Trainer then normalises differently (it divides each
micro-batch's mean loss by the accumulation steps).
"""

from transformers import LlamaConfig, LlamaForCausalLM


def _config(vocab_size, hidden_size, sequence_length):
    # Rotary embeddings rotate pairs: each head's width must be even (hidden 6 takes one head).
    num_heads = 2 if hidden_size % 4 == 0 else 1
    return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size,
                       intermediate_size=2 * hidden_size, num_hidden_layers=2,
                       num_attention_heads=num_heads, num_key_value_heads=1,
                       max_position_embeddings=sequence_length, tie_word_embeddings=False,
                       attn_implementation="eager")


def hf_tiny_llama(vocab_size, hidden_size, sequence_length):
    return LlamaForCausalLM(_config(vocab_size, hidden_size, sequence_length))


class LlamaWithoutLossKwargs(LlamaForCausalLM):
    """LlamaForCausalLM whose forward accepts no **kwargs: the loss is the model's own mean
    over the micro-batch's shifted labels (num_items_in_batch never reaches it)."""

    def forward(self, input_ids=None, attention_mask=None, labels=None):
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels)


def hf_tiny_llama_no_loss_kwargs(vocab_size, hidden_size, sequence_length):
    return LlamaWithoutLossKwargs(_config(vocab_size, hidden_size, sequence_length))
