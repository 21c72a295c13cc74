#pragma once
// Recipe step implementations ("variants"): named arithmetic for one training step, each a
// transcription of a torchtune recipe or of a proposed change to it.

#include <optional>
#include <string>
#include <vector>

#include "gradnorm/harness/model.hpp"
#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::harness {

enum class Role {
  reference,         // today's recipe; must agree with the oracle
  candidate,         // a proposed change; judged, never presumed right or wrong
  negative_control,  // a known-broken step; the harness must flag it where its bug is visible
};

enum class Recipe { full_finetune, lora_finetune, qat };

// Deliberate regressions, for negative controls. The first three are the ones the pull
// request in the seed found in its own skip change.
enum class Regression {
  none,
  step_inside_skip_gate,        // qat_single_device: optimizer.step()/zero_grad() gated out
  clip_inside_skip_gate,        // full_finetune_single_device: clipping gated out
  logged_loss_divided_by_n,     // running mean loss still divided by num_tokens when skipping
  scale_pass_dropped,           // loss multiplied by n but scale_grads(1/N) never runs
  non_finite_gradients_zeroed,  // NaN/Inf gradients replaced by zeros before the step
};

// Where the recipe puts 1/N. Per-token weight of a valid token on rank r after the rank
// average, with W ranks, n_r tokens on rank r and N in the step (DESIGN.md §1):
enum class Arithmetic {
  baseline,         // backward(mean * n), average, scale_grads(W / N): weight 1/N
  skip,             // the pull request: backward(mean), average, no scale: 1/(W n_r)
  world_size_only,  // the reviewer's words taken literally: skip, then scale_grads(W): 1/n_r
  global_prenorm,   // all-reduce the window's N first, backward(mean * n * W / N): 1/N
};

struct VariantSpec {
  std::string name;
  Role role = Role::reference;
  Recipe recipe = Recipe::full_finetune;
  std::string reference;  // the variant whose error behaviour this one must match
  std::string models;     // which recipe (and which change) it transcribes
  // The skip and world-size-only arithmetics apply only where the pull request's gate is
  // open (accumulation 1, no optimizer in backward); elsewhere they behave as baseline.
  Arithmetic arithmetic = Arithmetic::baseline;
  bool force_optimizer_in_backward = false;
  Regression regression = Regression::none;
};

// Thrown when a recipe rejects its configuration on purpose (torchtune raises there too).
class RecipeRefusal : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Every registered variant, in a fixed order.
[[nodiscard]] const std::vector<VariantSpec>& variants();
// Throws scenarios::InvalidInput listing the registered names.
[[nodiscard]] const VariantSpec& find_variant(std::string_view name);
// Variants whose name matches a shell-style pattern; throws InvalidInput when none does.
[[nodiscard]] std::vector<VariantSpec> select_variants(std::string_view pattern);

// The model a variant trains on a scenario: the LoRA recipe always trains the LoRA model,
// QAT fake-quantises the scenario's model, the full recipe trains the scenario's model.
[[nodiscard]] ModelConfig model_config_for(const VariantSpec& variant,
                                           const scenarios::Scenario& scenario);

// Why the harness cannot run this variant on this scenario, if it cannot (the pair is then
// left out of an evaluation and counted).
[[nodiscard]] std::optional<std::string> not_applicable(const VariantSpec& variant,
                                                        const scenarios::Scenario& scenario);

// True where the pull request's gate is open for this variant: its arithmetic is not
// baseline, accumulation is 1 and the optimizer does not run in backward.
[[nodiscard]] bool skip_gate_open(const VariantSpec& variant, const scenarios::Scenario& scenario);

[[nodiscard]] std::string_view to_string(Arithmetic arithmetic);
[[nodiscard]] std::string_view to_string(Role role);
[[nodiscard]] std::string_view to_string(Recipe recipe);
[[nodiscard]] std::string_view to_string(Regression regression);

}  // namespace gradnorm::harness
