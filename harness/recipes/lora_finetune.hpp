#pragma once
// torchtune's LoRA recipes, for the recipe files and the controls that break them. Private
// to the harness.

#include "full_finetune.hpp"

namespace gradnorm::harness::recipes {

// lora_finetune_single_device.py / lora_finetune_distributed.py train(): the full recipe's
// token-sum normalisation on frozen base weights and trainable adapters. The LoRA recipes
// never read optimizer_in_bwd, so a scenario asking for it trains the usual way; they clip
// when clip_grad_norm is not None and log running_loss.item() / num_tokens.
class LoraFinetune : public FullFinetune {
 public:
  void prepare(StepContext& context) override;

 protected:
  bool clip_gate(const StepContext& context) const override;
  double loss_to_log(const Window& totals, const StepContext& context) const override;
};

[[nodiscard]] std::vector<Citation> lora_finetune_citations();

}  // namespace gradnorm::harness::recipes
