// torchtune's full fine-tuning recipes and the candidates that move their 1/N: the pull
// request's skip, the review's world-size-only reading, and a global pre-normalisation.
#include "full_finetune.hpp"

#include <ATen/ATen.h>

#include "gradnorm/harness/training.hpp"

namespace gradnorm::harness::recipes {
namespace {

constexpr const char* kSingleDevice = "recipes/full_finetune_single_device.py";
constexpr const char* kDistributed = "recipes/full_finetune_distributed.py";

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
    const at::Tensor scale =
        at::scalar_tensor(context.world_size(), at::kFloat) / count[0].to(at::kFloat);
    Window window = empty_window();
    for (const MicroBatch& batch : context.micro_batches()) {
      const at::Tensor current_num_tokens = training::valid_token_count(batch);
      window.num_tokens += current_num_tokens;
      const at::Tensor current_loss =
          context.loss(context.model().logits(batch), batch.labels) * current_num_tokens;
      window.running_loss = window.running_loss + current_loss.detach();
      training::backward(context, current_loss * scale);
    }
    if (context.optimizer().per_parameter()) return finish_in_backward(context, window);
    training::rank_average(context);
    const Window totals = all_reduce_totals(context, window);
    clip_and_step(context);
    context.log_loss(training::loss_to_log(totals.running_loss, totals.num_tokens));
  }
};

}  // namespace

void pull_request_skip_window(StepContext& context) {
  const Window window = backward_means(context);
  training::rank_average(context);
  const Window totals = all_reduce_totals(context, window);
  clip_and_step(context);
  context.log_loss(mean_loss_to_log(context, totals));
}

void PullRequestSkip::train_step(StepContext& context) {
  if (!skip_gate_open(context.scenario())) return FullFinetune::train_step(context);
  pull_request_skip_window(context);
}

bool skip_gate_open(const scenarios::Scenario& s) {
  return s.accumulation_steps == 1 && !s.optimizer_in_backward;
}

void setup_optimizer_in_backward(StepContext& context) {
  if (context.max_norm()) {
    throw RecipeRefusal("Gradient clipping is not supported with optimizer in backward");
  }
  if (context.scenario().accumulation_steps > 1) {
    throw RecipeRefusal("Gradient accumulation is not supported with optimizer in backward");
  }
  training::register_optim_in_bwd_hooks(context);
}

void FullFinetune::prepare(StepContext& context) {
  if (context.scenario().optimizer_in_backward) setup_optimizer_in_backward(context);
}

void FullFinetune::train_step(StepContext& context) {
  const Window window = backward_token_sums(context);
  if (context.optimizer().per_parameter()) return finish_in_backward(context, window);
  training::rank_average(context);
  const Window totals = all_reduce_totals(context, window);
  // `world_size / num_tokens` on an int64 tensor: a float32 scalar, whatever the gradient
  // dtype (`1 / num_tokens` on one device).
  training::scale_grads(context, at::scalar_tensor(context.world_size(), at::kFloat) /
                                     totals.num_tokens.to(at::kFloat));
  clip_and_step(context);
  context.log_loss(training::loss_to_log(totals.running_loss, totals.num_tokens));
}

Window backward_token_sums(StepContext& context) {
  Window window = empty_window();
  const bool in_backward = context.optimizer().per_parameter();
  for (const MicroBatch& batch : context.micro_batches()) {
    const at::Tensor current_num_tokens = training::valid_token_count(batch);
    window.num_tokens += current_num_tokens;
    // The loss is a token mean; times n it is a token sum, so the whole window can be
    // normalised by its total count at the end.
    at::Tensor current_loss =
        context.loss(context.model().logits(batch), batch.labels) * current_num_tokens;
    window.running_loss = window.running_loss + current_loss.detach();
    if (in_backward) current_loss = current_loss / window.num_tokens;
    training::backward(context, current_loss);
  }
  return window;
}

Window backward_means(StepContext& context) {
  Window window = empty_window();
  for (const MicroBatch& batch : context.micro_batches()) {
    window.num_tokens += training::valid_token_count(batch);
    const at::Tensor mean = context.loss(context.model().logits(batch), batch.labels);
    window.running_loss = window.running_loss + mean.detach();
    training::backward(context, mean);
  }
  return window;
}

Window all_reduce_totals(StepContext& context, const Window& window) {
  std::vector<at::Tensor> totals{window.num_tokens, window.running_loss};
  context.comm().all_reduce_sum(totals);
  return Window{totals[0], totals[1]};
}

void clip_and_step(StepContext& context) {
  if (context.max_norm()) training::clip_grad_norm(context, *context.max_norm());
  context.optimizer().step();
  context.optimizer().zero_grad(/*set_to_none=*/true);
}

void finish_in_backward(StepContext& context, const Window& window) {
  context.optimizer().zero_grad(/*set_to_none=*/true);
  context.optimizer().step();  // every parameter already stepped in its hook
  const Window totals = all_reduce_totals(context, window);
  context.log_loss(training::loss_to_log(totals.running_loss, totals.num_tokens));
}

double mean_loss_to_log(const StepContext& context, const Window& totals) {
  // Each rank's running_loss holds a mean: the recipe divides the all-reduced sum by
  // world_size (by 1.0 on one device), a Python float division.
  return totals.running_loss.item<double>() / context.world_size();
}

std::optional<std::string> single_device_in_backward(const scenarios::Scenario& s) {
  if (s.optimizer_in_backward && s.world_size > 1) {
    return std::string("optimizer in backward is modelled on one device only");
  }
  return std::nullopt;
}

std::vector<Citation> full_finetune_citations() {
  return {
      {kSingleDevice, 609, 619, "backward(loss * current_num_tokens), running_loss"},
      {kSingleDevice, 622, 645, "scale_grads_(1 / num_tokens), clip, step, zero_grad, loss"},
      {kDistributed, 1004, 1024, "backward(loss * current_num_tokens) under FSDP"},
      {kDistributed, 1027, 1069,
       "all_reduce num_tokens and running_loss, scale_grads_(world_size / num_tokens), clip, "
       "step, zero_grad, loss_to_log"},
      {"torchtune/training/_grad_scaler.py", 18, 68, "scale_grads: p.grad *= scaler"},
  };
}

void register_full_finetune() {
  register_variant({
      .name = "baseline",
      .role = Role::reference,
      .reference = "baseline",
      .summary = "backward(mean * n); at the window's end the rank average, N all-reduced, "
                 "scale_grads(world_size / N), clip, step, zero_grad(set_to_none)",
      .cites = full_finetune_citations(),
      .make = [] { return std::make_unique<FullFinetune>(); },
      .cannot_run = single_device_in_backward,
  });
  register_variant({
      .name = "skip",
      .role = Role::candidate,
      .reference = "baseline",
      .summary = "the pull request: with grad_accum == 1 and no optimizer in backward, "
                 "backward(mean) and no scale_grads; clip and step outside the gate; "
                 "loss_to_log = running_loss / world_size",
      .cites = {{kSingleDevice, 609, 645, "the lines the pull request gates"}},
      .make = [] { return std::make_unique<PullRequestSkip>(); },
      .cannot_run = single_device_in_backward,
  });
  register_variant({
      .name = "world-size-only",
      .role = Role::candidate,
      .reference = "baseline",
      .summary = "the review's \"scale by world_size alone rather than skipping the call\" "
                 "taken literally: backward(mean), rank average, scale_grads(world_size)",
      .cites = {{kDistributed, 1035, 1039, "the scale_grads_ call the review would change"}},
      .make = [] { return std::make_unique<WorldSizeOnly>(); },
      .cannot_run = single_device_in_backward,
  });
  register_variant({
      .name = "global-prenorm",
      .role = Role::candidate,
      .reference = "baseline",
      .summary = "all-reduce the window's token count before backward, then "
                 "backward(mean * n * world_size / N); no pass over the gradients",
      .cites = {{kDistributed, 1020, 1023,
                 "the optimizer-in-backward path that already pre-normalises the loss"}},
      .make = [] { return std::make_unique<GlobalPrenorm>(); },
      .cannot_run = single_device_in_backward,
  });
}

}  // namespace gradnorm::harness::recipes
