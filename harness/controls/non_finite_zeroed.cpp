// The full recipe that replaces NaN/Inf gradients with zeros before clipping: an all-masked
// step becomes a silent finite update.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "../recipes/full_finetune.hpp"
#include "controls.hpp"
#include "gradnorm/harness/training.hpp"

namespace gradnorm::harness::controls {
namespace {

using namespace recipes;

class NonFiniteZeroed final : public FullFinetune {
 public:
  void train_step(StepContext& context) override {
    if (in_backward(context)) return FullFinetune::train_step(context);
    const Window window = backward_token_sums(context);
    training::rank_average(context);
    const Window totals = all_reduce_totals(context, window);
    scale_by_world_over_tokens(context, totals);
    {
      // The regression: NaN and Inf gradients become zeros.
      at::NoGradGuard no_grad;
      for (const at::Tensor& p : context.optimizer().parameters()) {
        if (p.grad().defined()) p.mutable_grad().nan_to_num_(0.0, 0.0, 0.0);
      }
    }
    clip_and_step(context);
    context.log_loss(loss_to_log(totals, context));
  }
};

Visibility non_finite_zeroed_visible(const scenarios::Scenario& s, const ContractFacts& facts) {
  if (facts.global_token_count == 0 && s.loss != scenarios::LossKind::linear_ce) {
    return {true, "N == 0 and the loss yields NaN gradients that the control hides"};
  }
  return {false, "gradients are finite (or backward raises) so there is nothing to hide"};
}

}  // namespace

void register_non_finite_zeroed() {
  register_variant({
      .name = "broken/non-finite-zeroed",
      .role = Role::negative_control,
      .reference = "baseline",
      .summary = "baseline that replaces NaN/Inf gradients with zeros before clipping, hiding "
                 "an all-masked step as a silent finite update",
      .cites = {{"recipes/full_finetune_single_device.py", 622, 631,
                 "between scale_grads_ and clip_grad_norm_"}},
      .make = [] { return std::make_unique<NonFiniteZeroed>(); },
      .bug_visible = non_finite_zeroed_visible,
  });
}

}  // namespace gradnorm::harness::controls
