// The pull request's first qat_single_device change: optimizer.step() and zero_grad() moved
// inside the skip gate, so with grad_accum == 1 nothing ever steps.
#include "../recipes/qat.hpp"
#include "controls.hpp"
#include "gradnorm/harness/training.hpp"

namespace gradnorm::harness::controls {
namespace {

using namespace recipes;

class StepInsideSkipGate final : public QatFinetune {
 public:
  void train_step(StepContext& context) override {
    if (!skip_gate_open(context.scenario())) return QatFinetune::train_step(context);
    const Window window = backward_means(context);
    training::rank_average(context);
    const Window totals = all_reduce_totals(context, window);
    if (clip_gate(context)) training::clip_grad_norm(context, *context.max_norm());
    // The regression: no optimizer.step() and no zero_grad() here. The gradients stay and
    // pile into the next window.
    context.log_loss(mean_loss_to_log(context, totals));
  }
};

Visibility step_inside_skip_gate_visible(const scenarios::Scenario& s, const ContractFacts& facts) {
  if (facts.global_token_count > 0 && skip_gate_open(s)) {
    return {true, "skip gate open and N > 0: the step must move"};
  }
  return {false, "skip gate closed or N == 0: the gated step runs or nothing exists"};
}

}  // namespace

void register_step_inside_skip_gate() {
  register_variant({
      .name = "broken/step-inside-skip-gate",
      .role = Role::negative_control,
      .reference = "qat-baseline",
      .summary = "the pull request's first QAT change: optimizer.step() and zero_grad() "
                 "inside the skip gate, so with grad_accum == 1 nothing steps",
      .cites = {{"recipes/qat_single_device.py", 592, 606, "the step the change gated out"}},
      .trains = TrainedModel::fake_quantized,
      .make = [] { return std::make_unique<StepInsideSkipGate>(); },
      .bug_visible = step_inside_skip_gate_visible,
  });
}

}  // namespace gradnorm::harness::controls
