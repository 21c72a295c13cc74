#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fnmatch.h>

#include "gradnorm/harness/variant.hpp"

namespace gradnorm::harness {
namespace {

constexpr const char* kFullRecipe = "torchtune recipes/full_finetune_single_device.py, train()";
constexpr const char* kLoraRecipe = "torchtune recipes/lora_finetune_single_device.py, train()";
constexpr const char* kQatRecipe = "torchtune recipes/qat_single_device.py, train()";
constexpr const char* kFullDistributed =
    "torchtune recipes/full_finetune_distributed.py, train() (world_size > 1)";
constexpr const char* kLoraDistributed =
    "torchtune recipes/lora_finetune_distributed.py, train() (world_size > 1)";

std::vector<VariantSpec> build_variants() {
  std::vector<VariantSpec> out;
  auto add = [&](VariantSpec spec) { out.push_back(std::move(spec)); };

  add({.name = "baseline", .role = Role::reference, .recipe = Recipe::full_finetune,
       .reference = "baseline",
       .models = fmt::format("{}: backward(loss * current_num_tokens); at the window's end "
                             "scale_grads(1 / num_tokens), clip, step, zero_grad(set_to_none). "
                             "{}: the same after averaging gradients over ranks, with "
                             "num_tokens and running_loss all-reduced and scale_grads(world_size "
                             "/ num_tokens)",
                             kFullRecipe, kFullDistributed)});
  add({.name = "skip", .role = Role::candidate, .recipe = Recipe::full_finetune,
       .reference = "baseline",
       .models = fmt::format("the pull request's {}: with grad_accum == 1 and no optimizer in "
                             "backward, backward(mean) and no scale_grads; clip and step outside "
                             "the gate; loss_to_log denominator 1",
                             kFullRecipe),
       .arithmetic = Arithmetic::skip});
  add({.name = "world-size-only", .role = Role::candidate, .recipe = Recipe::full_finetune,
       .reference = "baseline",
       .models = "the review's suggestion taken literally: \"scale by world_size alone rather "
                 "than skipping the call\": backward(mean), average over ranks, "
                 "scale_grads(world_size)",
       .arithmetic = Arithmetic::world_size_only});
  add({.name = "global-prenorm", .role = Role::candidate, .recipe = Recipe::full_finetune,
       .reference = "baseline",
       .models = "all-reduce the whole window's token count before backward, then "
                 "backward(mean * n * world_size / N); no pass over the gradients",
       .arithmetic = Arithmetic::global_prenorm});
  add({.name = "optimizer-in-backward", .role = Role::reference, .recipe = Recipe::full_finetune,
       .reference = "optimizer-in-backward",
       .models = fmt::format("{} with optimizer_in_bwd=True: backward of the pre-normalised "
                             "loss, one optimizer per parameter stepped from its gradient hook; "
                             "refuses clipping and accumulation",
                             kFullRecipe),
       .force_optimizer_in_backward = true});
  add({.name = "lora-baseline", .role = Role::reference, .recipe = Recipe::lora_finetune,
       .reference = "lora-baseline",
       .models = fmt::format("{} and {}: the full recipe's arithmetic on frozen base weights "
                             "and trainable adapters",
                             kLoraRecipe, kLoraDistributed)});
  add({.name = "lora-skip", .role = Role::candidate, .recipe = Recipe::lora_finetune,
       .reference = "lora-baseline",
       .models = fmt::format("the pull request's {}", kLoraRecipe),
       .arithmetic = Arithmetic::skip});
  add({.name = "qat-baseline", .role = Role::reference, .recipe = Recipe::qat,
       .reference = "qat-baseline",
       .models = fmt::format("{}: the full recipe's arithmetic through fake-quantised linears",
                             kQatRecipe)});
  add({.name = "qat-skip", .role = Role::candidate, .recipe = Recipe::qat,
       .reference = "qat-baseline",
       .models = fmt::format("the pull request's {} after its fix: step and zero_grad outside "
                             "the skip gate",
                             kQatRecipe),
       .arithmetic = Arithmetic::skip});

  // Negative controls: the pull request's own three regressions, and two more.
  add({.name = "broken/step-inside-skip-gate", .role = Role::negative_control,
       .recipe = Recipe::qat, .reference = "qat-baseline",
       .models = fmt::format("the pull request's first {}: optimizer.step() and zero_grad() "
                             "inside the skip gate, so with grad_accum == 1 nothing steps",
                             kQatRecipe),
       .arithmetic = Arithmetic::skip,
       .regression = Regression::step_inside_skip_gate});
  add({.name = "broken/clip-inside-skip-gate", .role = Role::negative_control,
       .recipe = Recipe::full_finetune, .reference = "baseline",
       .models = fmt::format("the pull request's first {}: clip_grad_norm_ inside the skip "
                             "gate, so with grad_accum == 1 clipping is silently off",
                             kFullRecipe),
       .arithmetic = Arithmetic::skip,
       .regression = Regression::clip_inside_skip_gate});
  add({.name = "broken/logged-loss-divided-by-n", .role = Role::negative_control,
       .recipe = Recipe::lora_finetune, .reference = "lora-baseline",
       .models = fmt::format("the pull request's first {}: loss_to_log = running_loss / "
                             "num_tokens although running_loss already holds a mean",
                             kLoraRecipe),
       .arithmetic = Arithmetic::skip,
       .regression = Regression::logged_loss_divided_by_n});
  add({.name = "broken/scale-pass-dropped", .role = Role::negative_control,
       .recipe = Recipe::full_finetune, .reference = "baseline",
       .models = "baseline with scale_grads removed but the loss still multiplied by n "
                 "(gradients are token sums)",
       .regression = Regression::scale_pass_dropped});
  add({.name = "broken/non-finite-zeroed", .role = Role::negative_control,
       .recipe = Recipe::full_finetune, .reference = "baseline",
       .models = "baseline that replaces NaN/Inf gradients with zeros before clipping, hiding "
                 "an all-masked step as a silent finite update",
       .regression = Regression::non_finite_gradients_zeroed});
  return out;
}

}  // namespace

const std::vector<VariantSpec>& variants() {
  static const std::vector<VariantSpec> all = build_variants();
  return all;
}

const VariantSpec& find_variant(std::string_view name) {
  std::vector<std::string_view> names;
  for (const VariantSpec& v : variants()) {
    if (v.name == name) return v;
    names.push_back(v.name);
  }
  throw scenarios::InvalidInput(
      fmt::format("unknown variant '{}': expected one of {}", name, fmt::join(names, ", ")));
}

std::vector<VariantSpec> select_variants(std::string_view pattern) {
  const std::string text(pattern);
  std::vector<VariantSpec> out;
  for (const VariantSpec& v : variants()) {
    if (v.name == text || fnmatch(text.c_str(), v.name.c_str(), 0) == 0) out.push_back(v);
  }
  if (out.empty()) (void)find_variant(pattern);  // throws with the list of names
  return out;
}

bool skip_gate_open(const VariantSpec& v, const scenarios::Scenario& s) {
  return v.arithmetic != Arithmetic::baseline && v.arithmetic != Arithmetic::global_prenorm &&
         s.accumulation_steps == 1 && !s.optimizer_in_backward && !v.force_optimizer_in_backward;
}

std::optional<std::string> not_applicable(const VariantSpec& v, const scenarios::Scenario& s) {
  const bool in_backward = v.force_optimizer_in_backward || s.optimizer_in_backward;
  if (in_backward && s.world_size > 1) {
    return std::string("optimizer in backward is modelled on one device only");
  }
  return std::nullopt;
}

std::string_view to_string(Arithmetic arithmetic) {
  switch (arithmetic) {
    case Arithmetic::baseline: return "baseline";
    case Arithmetic::skip: return "skip";
    case Arithmetic::world_size_only: return "world-size-only";
    case Arithmetic::global_prenorm: return "global-prenorm";
  }
  return "<unknown>";
}

ModelConfig model_config_for(const VariantSpec& variant, const scenarios::Scenario& scenario) {
  if (scenario.model == scenarios::ModelKind::token_probe) {
    // The probe has no linears: LoRA adapters and fake quantisation do not apply to it.
    return ModelConfig{scenarios::ModelKind::token_probe, false, false};
  }
  const bool lora_model = scenario.model == scenarios::ModelKind::lora;
  const scenarios::ModelKind base =
      lora_model ? scenarios::ModelKind::causal_lm : scenario.model;
  switch (variant.recipe) {
    case Recipe::full_finetune: return ModelConfig{base, lora_model, false};
    case Recipe::lora_finetune: return ModelConfig{base, true, false};
    case Recipe::qat: return ModelConfig{base, lora_model, true};
  }
  TORCH_INTERNAL_ASSERT(false, "harness bug: unhandled recipe");
}

std::string_view to_string(Role role) {
  switch (role) {
    case Role::reference: return "reference";
    case Role::candidate: return "candidate";
    case Role::negative_control: return "negative-control";
  }
  return "<unknown>";
}

std::string_view to_string(Recipe recipe) {
  switch (recipe) {
    case Recipe::full_finetune: return "full_finetune_single_device";
    case Recipe::lora_finetune: return "lora_finetune_single_device";
    case Recipe::qat: return "qat_single_device";
  }
  return "<unknown>";
}

std::string_view to_string(Regression regression) {
  switch (regression) {
    case Regression::none: return "none";
    case Regression::step_inside_skip_gate: return "step-inside-skip-gate";
    case Regression::clip_inside_skip_gate: return "clip-inside-skip-gate";
    case Regression::logged_loss_divided_by_n: return "logged-loss-divided-by-n";
    case Regression::scale_pass_dropped: return "scale-pass-dropped";
    case Regression::non_finite_gradients_zeroed: return "non-finite-zeroed";
  }
  return "<unknown>";
}

}  // namespace gradnorm::harness
