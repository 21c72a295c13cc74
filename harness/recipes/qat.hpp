#pragma once
// torchtune's QAT recipes, for the recipe file and the controls that break them. Private to
// the harness.

#include "full_finetune.hpp"

namespace gradnorm::harness::recipes {

// qat_single_device.py on one rank, qat_distributed.py on more: the full recipes'
// normalisation through fake-quantised linears; clips when clip_grad_norm is not None, logs
// running_loss.item() / num_tokens, and with optimizer in backward on one device divides
// the token sum back by current_num_tokens before backward.
class QatFinetune : public FullFinetune {
 protected:
  void refuse_optimizer_in_backward(const StepContext& context) const override;
  void train_in_backward(StepContext& context) const override;
  bool clip_gate(const StepContext& context) const override;
  double loss_to_log(const Window& totals, const StepContext& context) const override;
};

}  // namespace gradnorm::harness::recipes
