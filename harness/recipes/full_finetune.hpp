#pragma once
// torchtune's full fine-tuning train step (full_finetune_single_device on one rank,
// full_finetune_distributed on more) and the pieces that the other recipes, the candidates
// and the negative controls rearrange. What a recipe writes its own way (its clipping gate,
// its logged loss, its optimizer-in-backward path) is a virtual member that the recipe's own
// file overrides. Private to the harness.

#include <ATen/core/Tensor.h>

#include <functional>

#include "gradnorm/harness/step.hpp"
#include "gradnorm/harness/training.hpp"
#include "gradnorm/harness/variant.hpp"

namespace gradnorm::harness::recipes {

// The accumulation window's totals, as the recipe keeps them: num_tokens (int64) and
// running_loss (float32, promoted to float64 by a float64 loss).
struct Window {
  at::Tensor num_tokens;
  at::Tensor running_loss;
};

class FullFinetune : public Step {
 public:
  // Optimizer in backward when the scenario asks: the recipe's refusals, then the hooks.
  void prepare(StepContext& context) override;
  // backward(mean * n) per micro-batch; at the window's end the rank average, the
  // all-reduced counts, scale_grads(world_size / num_tokens), clip, step, zero_grad.
  void train_step(StepContext& context) override;

 protected:
  // --- what each recipe writes its own way ---
  // Refuses clipping and accumulation with optimizer in backward, in the recipe's words.
  virtual void refuse_optimizer_in_backward(const StepContext& context) const;
  // The whole step when the optimizer steps in backward.
  virtual void train_in_backward(StepContext& context) const;
  // Whether clip_grad_norm_ runs: `if self._clip_grad_norm:` on one device (a max-norm of
  // 0 skips it), `if self._clip_grad_norm is not None:` across ranks.
  [[nodiscard]] virtual bool clip_gate(const StepContext& context) const;
  // loss_to_log of the token-sum path, from the all-reduced totals.
  [[nodiscard]] virtual double loss_to_log(const Window& totals, const StepContext& context) const;

  // --- pieces ---
  // The distributed optimizer-in-backward loop: the token sum per micro-batch, the counts
  // all-reduced before backward, then backward(normalise(loss, all-reduced totals)).
  using InBackwardNormaliser = std::function<at::Tensor(const at::Tensor&, const Window&)>;
  [[nodiscard]] static Window backward_normalised_in_backward(
      StepContext& context, const InBackwardNormaliser& normalise);
  // backward(mean * n) for every micro-batch.
  [[nodiscard]] static Window backward_token_sums(StepContext& context);
  // The skip path: backward(mean) for every micro-batch; running_loss sums the means.
  [[nodiscard]] static Window backward_means(StepContext& context);
  // num_tokens and running_loss all-reduced (SUM) over ranks.
  [[nodiscard]] static Window all_reduce_totals(StepContext& context, const Window& window);
  // scale_grads(world_size / num_tokens), the scale a float32 scalar.
  static void scale_by_world_over_tokens(StepContext& context, const Window& totals);
  // clip_grad_norm_ where the recipe's gate lets it, optimizer.step(), zero_grad(None).
  void clip_and_step(StepContext& context) const;
  [[nodiscard]] static bool in_backward(const StepContext& context);
};

// The pull request's change to a recipe: with its gate open (gradient_accumulation_steps
// == 1 and not optimizer_in_bwd), backward(mean) per micro-batch, the rank average, no
// scale_grads, clip and step outside the gate, loss_to_log = running_loss / world_size.
template <typename Recipe>
class PullRequestSkip : public Recipe {
 public:
  void train_step(StepContext& context) override;
};

// The pull request's gate.
[[nodiscard]] bool skip_gate_open(const scenarios::Scenario& scenario);
// The skip path's loss_to_log: running_loss (a sum of means) / world_size, in float64.
[[nodiscard]] double mean_loss_to_log(const StepContext& context, const Window& totals);

// Registration lines, one per file.
void register_full_finetune();
void register_lora_finetune();
void register_qat();
void register_optimizer_in_backward();
void register_knowledge_distillation();
void register_early_exit();

// Citations shared by the recipe and control files.
[[nodiscard]] std::vector<Citation> full_finetune_citations();
[[nodiscard]] std::vector<Citation> qat_citations();

template <typename Recipe>
void PullRequestSkip<Recipe>::train_step(StepContext& context) {
  if (!skip_gate_open(context.scenario())) return Recipe::train_step(context);
  const Window window = Recipe::backward_means(context);
  training::rank_average(context);
  const Window totals = Recipe::all_reduce_totals(context, window);
  this->clip_and_step(context);
  context.log_loss(mean_loss_to_log(context, totals));
}

}  // namespace gradnorm::harness::recipes
