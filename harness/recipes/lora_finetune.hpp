#pragma once
// torchtune's LoRA recipe, for the negative controls that break it. Private to the harness.

#include "full_finetune.hpp"

namespace gradnorm::harness::recipes {

// lora_finetune_single_device.py / lora_finetune_distributed.py train(): the full recipe's
// arithmetic; refuses optimizer in backward, which the LoRA recipes do not have.
class LoraFinetune : public FullFinetune {
 public:
  void prepare(StepContext& context) override;
};

[[nodiscard]] std::vector<Citation> lora_finetune_citations();

}  // namespace gradnorm::harness::recipes
