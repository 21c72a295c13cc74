// The pull request's first full_finetune_single_device change: clip_grad_norm_ moved inside
// the skip gate, so with grad_accum == 1 clipping is silently off.
#include "../recipes/full_finetune.hpp"
#include "controls.hpp"
#include "gradnorm/harness/training.hpp"

namespace gradnorm::harness::controls {
namespace {

using namespace recipes;

class ClipInsideSkipGate final : public FullFinetune {
 public:
  void train_step(StepContext& context) override {
    if (!skip_gate_open(context.scenario())) return FullFinetune::train_step(context);
    const Window window = backward_means(context);
    training::rank_average(context);
    const Window totals = all_reduce_totals(context, window);
    // The regression: no clip_grad_norm_ here, whatever max_norm says.
    context.optimizer().step();
    context.optimizer().zero_grad(/*set_to_none=*/true);
    context.log_loss(mean_loss_to_log(context, totals));
  }
};

Visibility clip_inside_skip_gate_visible(const scenarios::Scenario& s, const ContractFacts& facts) {
  const bool clip_bites = facts.first_clip_coef && *facts.first_clip_coef < 0.5;
  if (facts.global_token_count > 0 && skip_gate_open(s) && clip_bites) {
    return {true, "skip gate open and clipping scales the gradients by < 0.5"};
  }
  return {false, "skip gate closed or clipping does not bite"};
}

}  // namespace

void register_clip_inside_skip_gate() {
  register_variant({
      .name = "broken/clip-inside-skip-gate",
      .role = Role::negative_control,
      .reference = "baseline",
      .summary = "the pull request's first full-recipe change: clip_grad_norm_ inside the "
                 "skip gate, so with grad_accum == 1 clipping is silently off",
      .cites = {{"recipes/full_finetune_single_device.py", 628, 631, "the clipping it gated out"}},
      .make = [] { return std::make_unique<ClipInsideSkipGate>(); },
      .bug_visible = clip_inside_skip_gate_visible,
  });
}

}  // namespace gradnorm::harness::controls
