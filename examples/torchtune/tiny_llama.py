"""torchtune's own Llama 3 decoder, built by the installed torchtune's public builder, as a
gradnorm model (model = "python:tiny_llama.py:tiny_llama"): two layers, grouped-query
attention with rotary embeddings, RMSNorm, SwiGLU, sized by the scenario.

    gradnorm run -f examples/torchtune/models.toml -v baseline -v skip -v 'broken/*'

torchtune's TransformerDecoder casts its logits to float32 (modules/transformer.py, unembed)
and its RMSNorm computes in float32, so float64 scenarios refuse it: the oracle's float64
twin would not be float64 inside.
"""

from torchtune.models.llama3 import llama3


def tiny_llama(vocab_size, hidden_size, sequence_length):
    # Rotary embeddings rotate pairs: each head's width must be even (hidden 6 takes one head).
    num_heads = 2 if hidden_size % 4 == 0 else 1
    return llama3(vocab_size=vocab_size, num_layers=2, num_heads=num_heads, num_kv_heads=1,
                  embed_dim=hidden_size, max_seq_len=sequence_length,
                  intermediate_dim=2 * hidden_size)


def tiny_llama_lora(vocab_size, hidden_size, sequence_length):
    """The same decoder with torchtune's LoRA adapters on the attention's q and v
    projections (torchtune.models.llama3.lora_llama3), the base frozen as torchtune's LoRA
    recipes freeze it (set_trainable_params over get_adapter_params), so the oracle trains
    what the recipe trains."""
    from torchtune.models.llama3 import lora_llama3
    from torchtune.modules.peft import get_adapter_params, set_trainable_params
    config = tiny_llama_lora.torchtune_config
    num_heads = 2 if hidden_size % 4 == 0 else 1
    model = lora_llama3(vocab_size=vocab_size, num_layers=2, num_heads=num_heads, num_kv_heads=1,
                        embed_dim=hidden_size, max_seq_len=sequence_length,
                        intermediate_dim=2 * hidden_size, **config)
    set_trainable_params(model, get_adapter_params(model))
    return model


# What a LoRA recipe reads from its config's model section (lora_finetune_*.py read
# cfg.model.lora_rank and the rest); gradnorm's recipe config passes these.
tiny_llama_lora.torchtune_config = {"lora_attn_modules": ["q_proj", "v_proj"],
                                    "apply_lora_to_mlp": False, "apply_lora_to_output": False,
                                    "lora_rank": 2, "lora_alpha": 4.0}
