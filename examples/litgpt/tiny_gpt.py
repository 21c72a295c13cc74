"""litgpt's own GPT (litgpt.model.GPT) from a tiny Config, random weights, nothing downloaded: the
model gradnorm gives litgpt's fine-tuning scripts (--recipe litgpt:finetune_full). gradnorm
writes this config and the harness's initial parameters as the checkpoint directory litgpt
loads (model_config.yaml, lit_model.pth), and the oracle runs this same module in float64.
A Llama-like block: RMSNorm, rotary embeddings, LLaMAMLP, no biases."""


def tiny_gpt(vocab_size, hidden_size, sequence_length):
    from litgpt.config import Config
    from litgpt.model import GPT
    # The rotary embedding needs an even head size: two heads where that gives one.
    heads = 2 if hidden_size % 4 == 0 else 1
    config = Config(name="gradnorm-tiny-gpt", block_size=sequence_length, vocab_size=vocab_size,
                    padded_vocab_size=vocab_size, n_layer=1, n_head=heads, n_embd=hidden_size,
                    n_query_groups=heads, rotary_percentage=1.0, parallel_residual=False,
                    bias=False, norm_class_name="RMSNorm", mlp_class_name="LLaMAMLP",
                    intermediate_size=2 * hidden_size)
    return GPT(config)


def tiny_gpt_lora(vocab_size, hidden_size, sequence_length):
    """litgpt's LoRA GPT (litgpt.lora.GPT) of the same size, LoRA of rank 2 on the query and
    value projections, no dropout (the oracle has none), only the LoRA matrices trainable
    (litgpt's own mark_only_lora_as_trainable): what --recipe litgpt:finetune_lora trains.
    gradnorm passes these LoRA settings to finetune_lora's command line (--lora_r, ...)."""
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable
    base = tiny_gpt(vocab_size, hidden_size, sequence_length).config
    fields = {name: getattr(base, name) for name in (
        "name", "block_size", "vocab_size", "padded_vocab_size", "n_layer", "n_head", "n_embd",
        "n_query_groups", "rotary_percentage", "parallel_residual", "bias", "norm_class_name",
        "mlp_class_name", "intermediate_size")}
    config = Config(**fields, lora_r=2, lora_alpha=4, lora_dropout=0.0, lora_query=True,
                    lora_key=False, lora_value=True, lora_projection=False, lora_mlp=False,
                    lora_head=False)
    model = GPT(config)
    mark_only_lora_as_trainable(model)
    return model
