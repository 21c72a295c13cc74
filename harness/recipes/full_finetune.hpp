#pragma once
// torchtune's full fine-tuning train step (single device and distributed) and the pieces
// of it that its candidates and the negative controls rearrange. Private to the harness.

#include <ATen/core/Tensor.h>

#include "gradnorm/harness/step.hpp"
#include "gradnorm/harness/variant.hpp"

namespace gradnorm::harness::recipes {

// The accumulation window's totals, as the recipe keeps them: num_tokens (int64) and
// running_loss (float32, promoted to float64 by a float64 loss).
struct Window {
  at::Tensor num_tokens;
  at::Tensor running_loss;
};

// full_finetune_single_device.py / full_finetune_distributed.py train(): backward of the
// token sum mean * n per micro-batch; at the window's end the rank average, the
// all-reduced counts, scale_grads(world_size / num_tokens), clip, step, zero_grad.
// With the scenario's optimizer_in_backward: per-parameter optimizers in backward.
class FullFinetune : public Step {
 public:
  void prepare(StepContext& context) override;
  void train_step(StepContext& context) override;
};

// The pull request: with its gate open, backward(mean) per micro-batch, the rank average,
// no scale_grads, clip and step outside the gate, loss_to_log = running_loss / world_size.
void pull_request_skip_window(StepContext& context);

// The pull request's change to the recipe: its skip window where the gate is open.
class PullRequestSkip : public FullFinetune {
 public:
  void train_step(StepContext& context) override;
};

// The pull request's gate: gradient_accumulation_steps == 1 and not optimizer_in_bwd.
[[nodiscard]] bool skip_gate_open(const scenarios::Scenario& scenario);

// Refusals of torchtune's optimizer in backward (clipping, accumulation), then its hooks.
void setup_optimizer_in_backward(StepContext& context);

// backward(mean * n) for every micro-batch; divided by the running num_tokens when the
// optimizer steps in backward.
[[nodiscard]] Window backward_token_sums(StepContext& context);
// The skip path: backward(mean) for every micro-batch; running_loss sums the means.
[[nodiscard]] Window backward_means(StepContext& context);
// num_tokens and running_loss all-reduced (SUM) over ranks.
[[nodiscard]] Window all_reduce_totals(StepContext& context, const Window& window);
// clip_grad_norm_ when the scenario clips, optimizer.step(), zero_grad(set_to_none=True).
void clip_and_step(StepContext& context);
// The end of a window whose optimizer stepped in backward: zero_grad, the no-op step, the
// all-reduced totals and the logged loss.
void finish_in_backward(StepContext& context, const Window& window);
// The skip path's loss_to_log: running_loss (a sum of means) / world_size, in float64.
[[nodiscard]] double mean_loss_to_log(const StepContext& context, const Window& totals);

// Where every built-in recipe is modelled: optimizer in backward on one device only.
[[nodiscard]] std::optional<std::string> single_device_in_backward(const scenarios::Scenario& s);

// Registration lines, one per file.
void register_full_finetune();
void register_lora_finetune();
void register_qat();
void register_optimizer_in_backward();
void register_knowledge_distillation();

// Citations shared by the recipe and control files.
[[nodiscard]] std::vector<Citation> full_finetune_citations();
[[nodiscard]] std::vector<Citation> qat_citations();

}  // namespace gradnorm::harness::recipes
