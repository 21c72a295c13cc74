// torchtune's QAT recipes: the full recipes' normalisation through fake-quantised linears.
#include "qat.hpp"

#include <ATen/ATen.h>

namespace gradnorm::harness::recipes {
namespace {

constexpr const char* kQatSingleDevice = "recipes/qat_single_device.py";
constexpr const char* kQatDistributed = "recipes/qat_distributed.py";

}  // namespace

void QatFinetune::refuse_optimizer_in_backward(const StepContext& context) const {
  // qat_single_device.py:139-150, qat_distributed.py:231-241 (the two strings run together).
  if (context.max_norm()) {
    throw RecipeRefusal("Gradient clipping is not supported with optimizer in bwd.Please set "
                        "clip_grad_norm=None, or optimizer_in_bwd=False.");
  }
  if (context.scenario().accumulation_steps > 1) {
    throw RecipeRefusal("Gradient accumulation is not supported with optimizer in bwd.Please set "
                        "gradient_accumulation_steps=1, or optimizer_in_bwd=False.");
  }
}

void QatFinetune::train_in_backward(StepContext& context) const {
  if (context.world_size() > 1) return FullFinetune::train_in_backward(context);
  // qat_single_device.py:556-606: current_loss * current_num_tokens into running_loss, then
  // / current_num_tokens before backward; no step or zero_grad afterwards.
  Window window{at::zeros({}, at::kLong), at::zeros({}, at::kFloat)};
  for (const MicroBatch& batch : context.micro_batches()) {
    const at::Tensor current_num_tokens = training::valid_token_count(batch);
    window.num_tokens += current_num_tokens;
    at::Tensor current_loss =
        context.loss(context.model().logits(batch), batch.labels) * current_num_tokens;
    window.running_loss = window.running_loss + current_loss.detach();
    current_loss = current_loss / current_num_tokens;
    training::backward(context, current_loss);
  }
  context.log_loss(training::loss_to_log(window.running_loss, window.num_tokens));
}

bool QatFinetune::clip_gate(const StepContext& context) const {
  return context.max_norm().has_value();  // `if self._clip_grad_norm is not None:`
}

double QatFinetune::loss_to_log(const Window& totals, const StepContext& /*context*/) const {
  return training::loss_to_log(totals.running_loss, totals.num_tokens);
}

std::vector<Citation> qat_citations() {
  return {
      {kQatSingleDevice, 556, 590,
       "current_loss *= current_num_tokens, running_loss, (in backward: / current_num_tokens), "
       "backward"},
      {kQatSingleDevice, 592, 606, "scale_grads(1 / num_tokens), clip, step, zero_grad, loss_to_log"},
      {kQatSingleDevice, 139, 150, "refuses clipping and accumulation with optimizer in bwd"},
      {kQatDistributed, 987, 997,
       "backward(loss * current_num_tokens); with optimizer_in_bwd the counts all-reduced "
       "first and loss * (dp_degree / num_tokens)"},
      {kQatDistributed, 998, 1025,
       "all_reduce, scale_grads_(world_size / num_tokens), clip, step, zero_grad, loss_to_log"},
  };
}

void register_qat() {
  register_variant({
      .name = "qat-baseline",
      .role = Role::reference,
      .reference = "qat-baseline",
      .summary = "the full recipes' normalisation through fake-quantised (int4) linears; "
                 "qat_single_device on one rank, qat_distributed on more",
      .cites = qat_citations(),
      .trains = TrainedModel::fake_quantized,
      .make = [] { return std::make_unique<QatFinetune>(); },
  });
  register_variant({
      .name = "qat-skip",
      .role = Role::candidate,
      .reference = "qat-baseline",
      .summary = "the pull request's skip path in the QAT recipe after its fix: step and "
                 "zero_grad outside the gate",
      .cites = {{kQatSingleDevice, 556, 606, "the lines the pull request gates"}},
      .trains = TrainedModel::fake_quantized,
      .make = [] { return std::make_unique<PullRequestSkip<QatFinetune>>(); },
  });
}

}  // namespace gradnorm::harness::recipes
