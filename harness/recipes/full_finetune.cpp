// torchtune's full fine-tuning recipes and the candidates that move their 1/N: the pull
// request's skip, the review's world-size-only reading, and a global pre-normalisation.
// On one rank the step is full_finetune_single_device's, on more full_finetune_distributed's.
#include "full_finetune.hpp"

#include <ATen/ATen.h>

namespace gradnorm::harness::recipes {
namespace {

constexpr const char* kFullFinetuneSingleDevice = "recipes/full_finetune_single_device.py";
constexpr const char* kFullFinetuneDistributed = "recipes/full_finetune_distributed.py";

Window empty_window() { return Window{at::zeros({}, at::kLong), at::zeros({}, at::kFloat)}; }

// The review's "scale by world_size alone rather than skipping the call", taken literally.
class WorldSizeOnly final : public FullFinetune {
 public:
  void train_step(StepContext& context) override {
    if (!skip_gate_open(context.scenario())) return FullFinetune::train_step(context);
    const Window window = backward_means(context);
    training::rank_average(context);
    const Window totals = all_reduce_totals(context, window);
    training::scale_grads(context, at::scalar_tensor(context.world_size(), at::kLong));
    clip_and_step(context);
    context.log_loss(mean_loss_to_log(context, totals));
  }
};

// All-reduce the window's token count before any backward, then backward the loss already
// scaled by world_size / N: no pass over the gradients afterwards.
class GlobalPrenorm final : public FullFinetune {
 public:
  void train_step(StepContext& context) override {
    std::vector<at::Tensor> count{at::zeros({}, at::kLong)};
    for (const MicroBatch& batch : context.micro_batches()) {
      count[0] += training::valid_token_count(batch);
    }
    context.comm().all_reduce_sum(count);
    // world_size / num_tokens on an int64 tensor: a float32 scalar.
    const at::Tensor scale = training::number_over(context.world_size(), count[0]);
    Window window = empty_window();
    for (const MicroBatch& batch : context.micro_batches()) {
      const at::Tensor current_num_tokens = training::valid_token_count(batch);
      window.num_tokens += current_num_tokens;
      const at::Tensor current_loss =
          context.loss(context.model().logits(batch), batch.labels) * current_num_tokens;
      window.running_loss = window.running_loss + current_loss.detach();
      training::backward(context, current_loss * scale);
    }
    training::rank_average(context);
    const Window totals = all_reduce_totals(context, window);
    clip_and_step(context);
    context.log_loss(loss_to_log(totals, context));
  }
};

// The candidates change the token-sum path; with optimizer in backward the recipe already
// normalises before backward, and there is nothing for them to change.
std::optional<std::string> token_sum_path_only(const scenarios::Scenario& s) {
  if (s.optimizer_in_backward) {
    return std::string("a candidate for the token-sum path; optimizer in backward has none");
  }
  return std::nullopt;
}

}  // namespace

bool skip_gate_open(const scenarios::Scenario& s) {
  return s.accumulation_steps == 1 && !s.optimizer_in_backward;
}

bool FullFinetune::in_backward(const StepContext& context) {
  return context.optimizer().per_parameter();
}

void FullFinetune::prepare(StepContext& context) {
  if (!context.scenario().optimizer_in_backward) return;
  refuse_optimizer_in_backward(context);
  training::register_optim_in_bwd_hooks(context);
}

void FullFinetune::refuse_optimizer_in_backward(const StepContext& context) const {
  // full_finetune_single_device.py:153-160 and full_finetune_distributed.py:221-232.
  const bool one_device = context.world_size() == 1;
  if (context.max_norm()) {
    throw RecipeRefusal(one_device
                            ? "Gradient clipping is not supported with optimizer_in_bwd: True"
                            : "Gradient clipping is not supported with optimizer in bwd.");
  }
  if (context.scenario().accumulation_steps > 1) {
    throw RecipeRefusal(one_device
                            ? "Gradient accumulation is not supported with optimizer_in_bwd: True"
                            : "Gradient accumulation is not supported with optimizer in bwd.");
  }
}

void FullFinetune::train_in_backward(StepContext& context) const {
  Window window = empty_window();
  if (context.world_size() == 1) {
    // full_finetune_single_device.py:609-645: loss_factor 1.0, so backward the mean; the
    // optimizer stepped in its hooks; loss_value = running_loss / 1.0.
    for (const MicroBatch& batch : context.micro_batches()) {
      window.num_tokens += training::valid_token_count(batch);
      const at::Tensor current_loss = context.loss(context.model().logits(batch), batch.labels) * 1.0;
      window.running_loss = window.running_loss + current_loss.detach();
      training::backward(context, current_loss);
    }
    context.optimizer().step();  // a no-op for optimizer in backward
    context.optimizer().zero_grad(/*set_to_none=*/true);
    context.log_loss((window.running_loss / 1.0).item<double>());
    return;
  }
  // full_finetune_distributed.py:1009-1024: * (dp_degree / num_tokens), a float32 scalar;
  // dp_degree is the mesh's dp_replicate x dp_shard (the world size without tensor or context
  // parallelism). No step or zero_grad afterwards.
  const int dp_degree = context.scenario().data_parallel_size();
  window = backward_normalised_in_backward(
      context, [dp_degree](const at::Tensor& current_loss, const Window& totals) {
        return current_loss * training::number_over(dp_degree, totals.num_tokens);
      });
  context.log_loss(training::loss_to_log(window.running_loss, window.num_tokens));
}

Window FullFinetune::backward_normalised_in_backward(StepContext& context,
                                                     const InBackwardNormaliser& normalise) {
  // The token sum per micro-batch; num_tokens and running_loss all-reduced in place before
  // backward, then the recipe's normalisation of the loss.
  Window window = empty_window();
  for (const MicroBatch& batch : context.micro_batches()) {
    const at::Tensor current_num_tokens = training::valid_token_count(batch);
    window.num_tokens += current_num_tokens;
    const at::Tensor current_loss =
        context.loss(context.model().logits(batch), batch.labels) * current_num_tokens;
    window.running_loss = window.running_loss + current_loss.detach();
    std::vector<at::Tensor> num_tokens{window.num_tokens};
    context.comm().all_reduce_sum(num_tokens);
    std::vector<at::Tensor> running_loss{window.running_loss};
    context.comm().all_reduce_sum(running_loss);
    training::backward(context, normalise(current_loss, window));
  }
  return window;
}

bool FullFinetune::clip_gate(const StepContext& context) const {
  if (context.world_size() == 1) {
    // full_finetune_single_device.py:628, `if self._clip_grad_norm:`.
    return context.max_norm() && *context.max_norm() != 0;
  }
  return context.max_norm().has_value();  // full_finetune_distributed.py:1041
}

double FullFinetune::loss_to_log(const Window& totals, const StepContext& context) const {
  if (context.world_size() == 1) {
    // full_finetune_single_device.py:642-645: (running_loss / num_tokens).item(), a tensor
    // division in the running loss's own dtype.
    return (totals.running_loss / totals.num_tokens).item<double>();
  }
  // full_finetune_distributed.py:1069: running_loss.item() / num_tokens, float32.
  return training::loss_to_log(totals.running_loss, totals.num_tokens);
}

void FullFinetune::train_step(StepContext& context) {
  if (in_backward(context)) return train_in_backward(context);
  const Window window = backward_token_sums(context);
  training::rank_average(context);
  const Window totals = all_reduce_totals(context, window);
  scale_by_world_over_tokens(context, totals);
  clip_and_step(context);
  context.log_loss(loss_to_log(totals, context));
}

Window FullFinetune::backward_token_sums(StepContext& context) {
  Window window = empty_window();
  for (const MicroBatch& batch : context.micro_batches()) {
    const at::Tensor current_num_tokens = training::valid_token_count(batch);
    window.num_tokens += current_num_tokens;
    // The loss is a token mean; times n it is a token sum, so the whole window can be
    // normalised by its total count at the end.
    const at::Tensor current_loss =
        context.loss(context.model().logits(batch), batch.labels) * current_num_tokens;
    window.running_loss = window.running_loss + current_loss.detach();
    training::backward(context, current_loss);
  }
  return window;
}

Window FullFinetune::backward_means(StepContext& context) {
  Window window = empty_window();
  for (const MicroBatch& batch : context.micro_batches()) {
    window.num_tokens += training::valid_token_count(batch);
    const at::Tensor mean = context.loss(context.model().logits(batch), batch.labels);
    window.running_loss = window.running_loss + mean.detach();
    training::backward(context, mean);
  }
  return window;
}

Window FullFinetune::all_reduce_totals(StepContext& context, const Window& window) {
  std::vector<at::Tensor> totals{window.num_tokens, window.running_loss};
  context.comm().all_reduce_sum(totals);
  return Window{totals[0], totals[1]};
}

void FullFinetune::scale_by_world_over_tokens(StepContext& context, const Window& totals) {
  // `world_size / num_tokens` on an int64 tensor: a float32 scalar, whatever the gradient
  // dtype (`1 / num_tokens` on one device).
  training::scale_grads(context, training::number_over(context.world_size(), totals.num_tokens));
}

void FullFinetune::clip_and_step(StepContext& context) const {
  if (clip_gate(context)) training::clip_grad_norm(context, *context.max_norm());
  context.optimizer().step();
  context.optimizer().zero_grad(/*set_to_none=*/true);
}

double mean_loss_to_log(const StepContext& context, const Window& totals) {
  // Each rank's running_loss holds a mean: the recipe divides the all-reduced sum by
  // world_size (by 1.0 on one device), a Python float division.
  return totals.running_loss.item<double>() / context.world_size();
}

std::vector<Citation> full_finetune_citations() {
  return {
      {kFullFinetuneSingleDevice, 609, 619, "backward(loss * current_num_tokens), running_loss"},
      {kFullFinetuneSingleDevice, 622, 645,
       "scale_grads_(1.0 / num_tokens), `if self._clip_grad_norm:` clip, step, zero_grad, "
       "loss_value"},
      {kFullFinetuneSingleDevice, 149, 160, "refuses clipping and accumulation with optimizer_in_bwd"},
      {kFullFinetuneDistributed, 1004, 1024,
       "backward(loss * current_num_tokens); with optimizer_in_bwd the counts all-reduced "
       "first and loss * (dp_degree / num_tokens)"},
      {kFullFinetuneDistributed, 1027, 1069,
       "all_reduce num_tokens and running_loss, scale_grads_(world_size / num_tokens), clip, "
       "step, zero_grad, loss_to_log"},
      {kFullFinetuneDistributed, 221, 232, "refuses clipping and accumulation with optimizer in bwd"},
      {"torchtune/training/_grad_scaler.py", 18, 68, "scale_grads: p.grad *= scaler"},
  };
}

void register_full_finetune() {
  register_variant({
      .name = "baseline",
      .role = Role::reference,
      .reference = "baseline",
      .summary = "backward(mean * n); at the window's end the rank average, N all-reduced, "
                 "scale_grads(world_size / N), clip, step, zero_grad(set_to_none); "
                 "full_finetune_single_device on one rank, full_finetune_distributed on more",
      .cites = full_finetune_citations(),
      .make = [] { return std::make_unique<FullFinetune>(); },
  });
  register_variant({
      .name = "skip",
      .role = Role::candidate,
      .reference = "baseline",
      .summary = "the pull request: with grad_accum == 1 and no optimizer in backward, "
                 "backward(mean) and no scale_grads; clip and step outside the gate; "
                 "loss_to_log = running_loss / world_size",
      .cites = {{kFullFinetuneSingleDevice, 609, 645, "the lines the pull request gates"}},
      .make = [] { return std::make_unique<PullRequestSkip<FullFinetune>>(); },
  });
  register_variant({
      .name = "world-size-only",
      .role = Role::candidate,
      .reference = "baseline",
      .summary = "the review's \"scale by world_size alone rather than skipping the call\" "
                 "taken literally: backward(mean), rank average, scale_grads(world_size)",
      .cites = {{kFullFinetuneDistributed, 1035, 1039, "the scale_grads_ call the review would change"}},
      .make = [] { return std::make_unique<WorldSizeOnly>(); },
  });
  register_variant({
      .name = "global-prenorm",
      .role = Role::candidate,
      .reference = "baseline",
      .summary = "all-reduce the window's token count before backward, then "
                 "backward(mean * n * world_size / N); no pass over the gradients",
      .cites = {{kFullFinetuneDistributed, 1020, 1023,
                 "the optimizer-in-backward path that already pre-normalises the loss"}},
      .make = [] { return std::make_unique<GlobalPrenorm>(); },
      .cannot_run = token_sum_path_only,
  });
}

}  // namespace gradnorm::harness::recipes
