#include "own_steps.hpp"

#include <ATen/ATen.h>

#include <gradnorm/harness/step.hpp>
#include <gradnorm/harness/training.hpp>
#include <gradnorm/harness/variant.hpp>

namespace own_step {
namespace {

using gradnorm::harness::MicroBatch;
using gradnorm::harness::Step;
using gradnorm::harness::StepContext;
namespace training = gradnorm::harness::training;

// Backward the token sum of every micro-batch, then divide by the step's global count.
class TokenSum final : public Step {
 public:
  void train_step(StepContext& ctx) override {
    at::Tensor tokens = at::zeros({}, at::kLong);
    at::Tensor loss_sum = at::zeros({}, at::kDouble);
    for (const MicroBatch& batch : ctx.micro_batches()) {
      const at::Tensor n = training::valid_token_count(batch);
      const at::Tensor sum = ctx.loss(ctx.model().logits(batch), batch.labels) * n;
      tokens += n;
      loss_sum += sum.detach().to(at::kDouble);
      training::backward(ctx, sum);
    }
    training::rank_average(ctx);  // what DDP/FSDP do to gradients on more than one rank
    std::vector<at::Tensor> totals{tokens, loss_sum};
    ctx.comm().all_reduce_sum(totals);
    const double global_tokens = totals[0].item<double>();
    // The rank average divided by W: W / N leaves every token weighing 1/N.
    training::scale_grads(ctx, at::scalar_tensor(ctx.world_size() / global_tokens, at::kDouble));
    if (ctx.max_norm()) training::clip_grad_norm(ctx, *ctx.max_norm());
    ctx.optimizer().step();
    ctx.optimizer().zero_grad();
    ctx.log_loss(totals[1].item<double>() / global_tokens);
  }
};

// The same, but each rank divides by its own count before the rank average.
class LocalMean final : public Step {
 public:
  void train_step(StepContext& ctx) override {
    at::Tensor tokens = at::zeros({}, at::kLong);
    at::Tensor loss_sum = at::zeros({}, at::kDouble);
    for (const MicroBatch& batch : ctx.micro_batches()) {
      const at::Tensor n = training::valid_token_count(batch);
      const at::Tensor sum = ctx.loss(ctx.model().logits(batch), batch.labels) * n;
      tokens += n;
      loss_sum += sum.detach().to(at::kDouble);
      training::backward(ctx, sum);
    }
    const double local_tokens = tokens.item<double>();
    training::scale_grads(ctx, at::scalar_tensor(1.0 / local_tokens, at::kDouble));
    training::rank_average(ctx);
    std::vector<at::Tensor> local_mean{loss_sum / local_tokens};
    ctx.comm().all_reduce_sum(local_mean);
    if (ctx.max_norm()) training::clip_grad_norm(ctx, *ctx.max_norm());
    ctx.optimizer().step();
    ctx.optimizer().zero_grad();
    ctx.log_loss(local_mean[0].item<double>() / ctx.world_size());
  }
};

}  // namespace

void register_steps() {
  gradnorm::harness::register_variant({
      .name = "own/token-sum",
      .role = gradnorm::harness::Role::candidate,
      .reference = "baseline",
      .summary = "backward(token sum), rank average, scale_grads(W / N) in float64",
      .make = [] { return std::make_unique<TokenSum>(); },
  });
  gradnorm::harness::register_variant({
      .name = "own/local-mean",
      .role = gradnorm::harness::Role::candidate,
      .reference = "baseline",
      .summary = "backward(token sum), scale_grads(1 / n_rank), rank average",
      .make = [] { return std::make_unique<LocalMean>(); },
  });
}

}  // namespace own_step
