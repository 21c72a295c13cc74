// The pull request's first lora_finetune_single_device change: on the skip path the logged
// loss is still divided by num_tokens, although running_loss already holds a mean.
#include "../recipes/lora_finetune.hpp"
#include "controls.hpp"
#include "gradnorm/harness/training.hpp"

namespace gradnorm::harness::controls {
namespace {

using namespace recipes;

class LoggedLossDividedByN final : public LoraFinetune {
 public:
  void train_step(StepContext& context) override {
    if (!skip_gate_open(context.scenario())) return LoraFinetune::train_step(context);
    const Window window = backward_means(context);
    training::rank_average(context);
    const Window totals = all_reduce_totals(context, window);
    clip_and_step(context);
    // The regression: the token-sum recipe's loss_to_log on a running mean.
    context.log_loss(training::loss_to_log(totals.running_loss, totals.num_tokens));
  }
};

Visibility logged_loss_divided_by_n_visible(const scenarios::Scenario& s, const ContractFacts& facts) {
  const long n = facts.global_token_count;
  if (n > 0 && n != s.world_size && skip_gate_open(s)) {
    return {true, "skip gate open and N != W: dividing by N instead of W changes the loss"};
  }
  return {false, "skip gate closed or N == W: dividing by N changes nothing"};
}

}  // namespace

void register_logged_loss_divided_by_n() {
  register_variant({
      .name = "broken/logged-loss-divided-by-n",
      .role = Role::negative_control,
      .reference = "lora-baseline",
      .summary = "the pull request's first LoRA change: loss_to_log = running_loss / "
                 "num_tokens although running_loss already holds a mean",
      .cites = {{"recipes/lora_finetune_single_device.py", 658, 658, "loss_to_log"}},
      .trains = TrainedModel::lora_adapters,
      .make = [] { return std::make_unique<LoggedLossDividedByN>(); },
      .bug_visible = logged_loss_divided_by_n_visible,
  });
}

}  // namespace gradnorm::harness::controls
