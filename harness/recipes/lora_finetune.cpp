// torchtune's LoRA fine-tuning recipes: the full recipe's normalisation on frozen base
// weights and trainable adapters; and qat_lora_finetune_distributed, the same through
// fake-quantised linears.
#include "lora_finetune.hpp"

namespace gradnorm::harness::recipes {
namespace {

constexpr const char* kLoraFinetuneSingleDevice = "recipes/lora_finetune_single_device.py";
constexpr const char* kLoraFinetuneDistributed = "recipes/lora_finetune_distributed.py";
constexpr const char* kQatLora = "recipes/qat_lora_finetune_distributed.py";

}  // namespace

void LoraFinetune::prepare(StepContext& /*context*/) {}

bool LoraFinetune::clip_gate(const StepContext& context) const {
  return context.max_norm().has_value();  // `if self._clip_grad_norm is not None:`
}

double LoraFinetune::loss_to_log(const Window& totals, const StepContext& /*context*/) const {
  return training::loss_to_log(totals.running_loss, totals.num_tokens);
}

std::vector<Citation> lora_finetune_citations() {
  return {
      {kLoraFinetuneSingleDevice, 633, 642, "backward(loss * current_num_tokens), running_loss"},
      {kLoraFinetuneSingleDevice, 645, 658, "scale_grads(1 / num_tokens), clip, step, zero_grad, loss_to_log"},
      {kLoraFinetuneDistributed, 769, 781, "backward(loss * current_num_tokens) under FSDP"},
      {kLoraFinetuneDistributed, 784, 804,
       "all_reduce num_tokens and running_loss, scale_grads(world_size / num_tokens), clip, "
       "step, zero_grad, loss_to_log"},
  };
}

void register_lora_finetune() {
  register_variant({
      .name = "lora-baseline",
      .role = Role::reference,
      .reference = "lora-baseline",
      .summary = "the full recipe's normalisation on frozen base weights and trainable "
                 "adapters; clips when clip_grad_norm is not None; never reads optimizer_in_bwd",
      .cites = lora_finetune_citations(),
      .trains = TrainedModel::lora_adapters,
      .make = [] { return std::make_unique<LoraFinetune>(); },
  });
  register_variant({
      .name = "lora-skip",
      .role = Role::candidate,
      .reference = "lora-baseline",
      .summary = "the pull request's skip path in the LoRA recipe",
      .cites = {{kLoraFinetuneSingleDevice, 633, 658, "the lines the pull request gates"}},
      .trains = TrainedModel::lora_adapters,
      .make = [] { return std::make_unique<PullRequestSkip<LoraFinetune>>(); },
  });
  register_variant({
      .name = "qat-lora-distributed",
      .role = Role::reference,
      .reference = "qat-lora-distributed",
      .summary = "lora_finetune_distributed's normalisation through fake-quantised linears "
                 "with trainable adapters",
      .cites = {{kQatLora, 746, 755, "backward(loss * current_num_tokens)"},
                {kQatLora, 758, 778,
                 "all_reduce num_tokens and running_loss, scale_grads(world_size / num_tokens), "
                 "clip, step, zero_grad, loss_to_log"}},
      .trains = TrainedModel::lora_adapters_fake_quantized,
      .make = [] { return std::make_unique<LoraFinetune>(); },
  });
}

}  // namespace gradnorm::harness::recipes
