// torchtune's QAT recipe on one device: the full recipe's normalisation through
// fake-quantised linears, with optimizer in backward.
#include "full_finetune.hpp"

namespace gradnorm::harness::recipes {
namespace {

constexpr const char* kSingleDevice = "recipes/qat_single_device.py";

}  // namespace

std::vector<Citation> qat_citations() {
  return {
      {kSingleDevice, 556, 590,
       "current_loss *= current_num_tokens, running_loss, (in backward: / current_num_tokens), "
       "backward"},
      {kSingleDevice, 592, 606, "scale_grads(1 / num_tokens), clip, step, zero_grad, loss_to_log"},
      {kSingleDevice, 139, 150, "refuses clipping and accumulation with optimizer in backward"},
  };
}

void register_qat() {
  register_variant({
      .name = "qat-baseline",
      .role = Role::reference,
      .reference = "qat-baseline",
      .summary = "the full recipe's normalisation through fake-quantised (int4) linears",
      .cites = qat_citations(),
      .trains = TrainedModel::fake_quantized,
      .make = [] { return std::make_unique<FullFinetune>(); },
      .cannot_run = single_device_in_backward,
  });
  register_variant({
      .name = "qat-skip",
      .role = Role::candidate,
      .reference = "qat-baseline",
      .summary = "the pull request's skip path in the QAT recipe after its fix: step and "
                 "zero_grad outside the gate",
      .cites = {{kSingleDevice, 556, 606, "the lines the pull request gates"}},
      .trains = TrainedModel::fake_quantized,
      .make = [] { return std::make_unique<PullRequestSkip>(); },
      .cannot_run = single_device_in_backward,
  });
}

}  // namespace gradnorm::harness::recipes
