// torchtune's dev/early_exit_finetune_distributed, with the early-exit loss off (no hidden
// states requested): the full distributed recipe's loop, but its gradients are scaled by
// 1 / num_tokens after FSDP's average over ranks, and with optimizer in backward its loss
// is divided by num_tokens alone.
#include <ATen/ATen.h>

#include <algorithm>

#include <fmt/format.h>

#include "qat.hpp"

namespace gradnorm::harness::recipes {
namespace {

constexpr const char* kRecipe = "recipes/dev/early_exit_finetune_distributed.py";

// Its optimizer-in-backward checks, clipping gate (`is not None`) and logging
// (running_loss.item() / num_tokens) are the QAT recipes' word for word.
class EarlyExitFinetune final : public QatFinetune {
 public:
  void train_step(StepContext& context) override {
    if (in_backward(context)) return train_in_backward(context);
    const Window window = backward_token_sums(context);
    training::rank_average(context);  // FSDP, in backward
    const Window totals = all_reduce_totals(context, window);
    // `training.scale_grads(self._model, 1 / num_tokens)`: no world_size.
    training::scale_grads(context, training::number_over(1, totals.num_tokens));
    clip_and_step(context);
    context.log_loss(loss_to_log(totals, context));
  }

 protected:
  void train_in_backward(StepContext& context) const override {
    const Window window = backward_normalised_in_backward(
        context, [](const at::Tensor& current_loss, const Window& totals) {
          return current_loss / totals.num_tokens;  // no dp_degree
        });
    context.log_loss(loss_to_log(window, context));
  }
};

// Measured: after FSDP's 1/W average, scale_grads(1 / num_tokens) leaves every token
// weighing 1/(W N); the optimizer-in-backward path divides by num_tokens alone, the same.
std::optional<Finding> findings(const scenarios::Scenario& s, const ContractFacts& facts) {
  if (facts.global_token_count == 0 || s.world_size == 1) return std::nullopt;
  // An empty micro-batch's (or rank's) 0/0 mean reaches the logged loss, as in the
  // distributed recipe it copies.
  std::vector<std::string> checks{"gradients"};
  bool empty = false;
  for (const auto& row : s.valid_tokens) empty = empty || std::find(row.begin(), row.end(), 0) != row.end();
  if (empty) checks.push_back("logged-loss");
  return Finding{"fail",
                 fmt::format("{}:928 scales the gradients by 1 / num_tokens after FSDP has "
                             "averaged them over the {} ranks ({}:916 divides the "
                             "optimizer-in-backward loss by num_tokens alone): every token "
                             "weighs 1/(W N), the gradients are 1/W of the contract's "
                             "(relative error 1 - 1/W = {:.2g}); full_finetune_distributed "
                             "scales by world_size / num_tokens",
                             kRecipe, s.world_size, kRecipe,
                             1.0 - 1.0 / static_cast<double>(s.world_size)),
                 checks};
}

}  // namespace

void register_early_exit() {
  register_variant({
      .name = "early-exit-distributed",
      .role = Role::reference,
      .reference = "early-exit-distributed",
      .summary = "dev/early_exit_finetune_distributed without the early-exit loss: "
                 "backward(mean * n), FSDP average, all-reduced counts, scale_grads(1 / "
                 "num_tokens), clip, step",
      .cites = {{kRecipe, 863, 904, "backward(loss * current_num_tokens) (the plain-loss path)"},
                {kRecipe, 910, 916,
                 "optimizer in backward: counts all-reduced, current_loss / num_tokens"},
                {kRecipe, 918, 940, "all_reduce, scale_grads(1 / num_tokens), clip, step, "
                                    "loss_to_log"},
                {kRecipe, 213, 224, "refuses clipping and accumulation with optimizer in bwd"}},
      .make = [] { return std::make_unique<EarlyExitFinetune>(); },
      .findings = findings,
  });
}

}  // namespace gradnorm::harness::recipes
