// The full recipe with scale_grads removed but the loss still multiplied by n: the
// optimizer consumes token sums.
#include <ATen/ATen.h>

#include "../recipes/full_finetune.hpp"
#include "controls.hpp"
#include "gradnorm/harness/training.hpp"

namespace gradnorm::harness::controls {
namespace {

using namespace recipes;

class ScalePassDropped final : public FullFinetune {
 public:
  void train_step(StepContext& context) override {
    if (in_backward(context)) return FullFinetune::train_step(context);
    const Window window = backward_token_sums(context);
    training::rank_average(context);
    const Window totals = all_reduce_totals(context, window);
    // The regression: no scale_grads(world_size / num_tokens) here.
    clip_and_step(context);
    context.log_loss(loss_to_log(totals, context));
  }
};

Visibility scale_pass_dropped_visible(const scenarios::Scenario& s, const ContractFacts& facts) {
  const long n = facts.global_token_count;
  if (n > 0 && n != s.world_size && !s.optimizer_in_backward) {
    return {true, "N != W: the missing scale W/N is not 1"};
  }
  return {false, "N == W or optimizer in backward: the dropped scale is 1 or absent"};
}

}  // namespace

void register_scale_pass_dropped() {
  register_variant({
      .name = "broken/scale-pass-dropped",
      .role = Role::negative_control,
      .reference = "baseline",
      .summary = "baseline with scale_grads removed but the loss still multiplied by n "
                 "(gradients are token sums)",
      .cites = {{"recipes/full_finetune_single_device.py", 625, 627, "the scale it drops"}},
      .make = [] { return std::make_unique<ScalePassDropped>(); },
      .bug_visible = scale_pass_dropped_visible,
  });
}

}  // namespace gradnorm::harness::controls
