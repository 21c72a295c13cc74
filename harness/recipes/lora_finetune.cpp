// torchtune's LoRA fine-tuning recipes: the full recipe's normalisation on frozen base
// weights and trainable adapters, with no optimizer-in-backward path.
#include "full_finetune.hpp"
#include "lora_finetune.hpp"

namespace gradnorm::harness::recipes {
namespace {

constexpr const char* kSingleDevice = "recipes/lora_finetune_single_device.py";
constexpr const char* kDistributed = "recipes/lora_finetune_distributed.py";

class LoraSkip final : public LoraFinetune {
 public:
  void train_step(StepContext& context) override {
    if (!skip_gate_open(context.scenario())) return LoraFinetune::train_step(context);
    pull_request_skip_window(context);
  }
};

}  // namespace

void LoraFinetune::prepare(StepContext& context) {
  if (context.scenario().optimizer_in_backward) {
    throw RecipeRefusal("lora_finetune_single_device has no optimizer_in_bwd path");
  }
}

std::vector<Citation> lora_finetune_citations() {
  return {
      {kSingleDevice, 633, 642, "backward(loss * current_num_tokens), running_loss"},
      {kSingleDevice, 645, 658, "scale_grads(1 / num_tokens), clip, step, zero_grad, loss_to_log"},
      {kDistributed, 769, 781, "backward(loss * current_num_tokens) under FSDP"},
      {kDistributed, 784, 804,
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
                 "adapters; refuses optimizer in backward",
      .cites = lora_finetune_citations(),
      .trains = TrainedModel::lora_adapters,
      .make = [] { return std::make_unique<LoraFinetune>(); },
      .cannot_run = single_device_in_backward,
  });
  register_variant({
      .name = "lora-skip",
      .role = Role::candidate,
      .reference = "lora-baseline",
      .summary = "the pull request's skip path in the LoRA recipe",
      .cites = {{kSingleDevice, 633, 658, "the lines the pull request gates"}},
      .trains = TrainedModel::lora_adapters,
      .make = [] { return std::make_unique<LoraSkip>(); },
      .cannot_run = single_device_in_backward,
  });
}

}  // namespace gradnorm::harness::recipes
