#pragma once
// The registry of steps ("variants"): every step the harness can judge, built-in or added
// by a user's code at start-up, with its role, its reference and the recipe lines it
// transcribes (docs/design.md §5).

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gradnorm/harness/loss.hpp"
#include "gradnorm/harness/model.hpp"
#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::harness {

class Step;

enum class Role {
  reference,         // today's recipe; must agree with the oracle
  candidate,         // a proposed change; judged, never presumed right or wrong
  negative_control,  // a known-broken step; the harness must flag it where its bug is visible
};

// What the recipe trains of the scenario's model.
enum class TrainedModel {
  scenario_model,  // the model as the scenario describes it
  lora_adapters,   // base weights frozen, trainable low-rank adapters on every linear
  fake_quantized,  // QAT: linears fake-quantised to int4 in the forward pass
  lora_adapters_fake_quantized,  // QAT with LoRA: both
};

// The torchtune snapshot every built-in citation refers to.
inline constexpr std::string_view kTorchtuneCommit = "bd2a0fc7";

// A range of lines in a torchtune file at kTorchtuneCommit, and what they do.
struct Citation {
  std::string file;  // e.g. "recipes/full_finetune_single_device.py"
  int first_line = 0;
  int last_line = 0;
  std::string what;
};

// What the oracle says about a scenario, for deciding where a control's bug can show.
struct ContractFacts {
  long global_token_count = 0;           // N
  std::optional<double> first_clip_coef;  // clipping's coefficient at step 0, when it clips
};

struct Visibility {
  bool visible = false;
  std::string why;  // one line: why the bug changes (or cannot change) what a user sees
};

// What a recipe is known to get wrong on a scenario, found by running it against the
// oracle: the verdict it ends with, and why (the recipe line responsible, a measured figure).
// A run that no longer reproduces it says so.
struct Finding {
  std::string verdict;  // "fail", "error-mismatch", ...
  std::string reason;
  // The checks it fails, exactly (scenarios::ExpectedVerdict::checks); empty for an
  // error-mismatch means error-behaviour.
  std::vector<std::string> checks{};
};

struct VariantSpec {
  std::string name{};
  Role role = Role::candidate;
  // The variant whose error behaviour this one must match; its own name for a reference.
  std::string reference{};
  std::string summary{};         // one line: what the step does to the normalisation
  // A framework's own code (--recipe): what runs and its installed version ("transformers
  // 5.18.0's Trainer"), named by the table and the Markdown report; empty for other steps.
  std::string runs{};
  std::vector<Citation> cites{}; // the recipe lines it transcribes (or changes)
  TrainedModel trains = TrainedModel::scenario_model;
  // What the recipe optimises per token; knowledge_distillation gives the step a frozen
  // teacher and judges it against (1 - kd_ratio) * CE + kd_ratio * forward KL.
  Objective objective = Objective::scenario_loss;
  // A fresh step for one rank of one run.
  std::function<std::unique_ptr<Step>()> make{};
  // Why this step cannot run a scenario, if it cannot (the pair is then left out, counted).
  std::function<std::optional<std::string>(const scenarios::Scenario&)> cannot_run{};
  // Negative controls only: where the bug is visible, decided from the scenario and the
  // oracle alone, never from the control's own output.
  std::function<Visibility(const scenarios::Scenario&, const ContractFacts&)> bug_visible{};
  // References and candidates: the documented findings of this recipe, by scenario. A
  // finding the scenario itself documents (Scenario::expected_verdicts) takes precedence.
  std::function<std::optional<Finding>(const scenarios::Scenario&, const ContractFacts&)>
      findings{};
};

// Adds a step to the registry (after the built-ins, in call order). Call at start-up,
// before any run. Throws scenarios::InvalidInput for an empty or duplicate name, a missing
// factory, an unknown reference, or a negative control without bug_visible.
void register_variant(VariantSpec spec);

// mark_registered_variants marks the variants registered so far (gradnorm's own, and a C++
// program's own steps registered before its command line runs); forget_declared_variants
// forgets every one registered after the mark (Python steps, recipes, a scenario file's), or
// after gradnorm's own where none was made: a warm rank process, a copy of the process that
// declared them, declares them anew from its own command line. References find_variant gave
// for them are then invalid.
void mark_registered_variants();
void forget_declared_variants();

// Every registered variant, built-ins first, in registration order.
[[nodiscard]] std::vector<VariantSpec> variants();
// Throws scenarios::InvalidInput listing the registered names.
[[nodiscard]] const VariantSpec& find_variant(std::string_view name);
// Variants whose name matches a shell-style pattern; throws InvalidInput when none does.
[[nodiscard]] std::vector<VariantSpec> select_variants(std::string_view pattern);

// The model a variant trains on a scenario (LoRA adapters, fake quantisation, or as is).
[[nodiscard]] ModelConfig model_config_for(const VariantSpec& variant,
                                           const scenarios::Scenario& scenario);

// Why the harness cannot run this variant on this scenario, if it cannot.
[[nodiscard]] std::optional<std::string> not_applicable(const VariantSpec& variant,
                                                        const scenarios::Scenario& scenario);

// What `variant` is documented to get wrong on this scenario: the scenario's own finding for
// it (Scenario::expected_verdicts, by name pattern), else the recipe's (VariantSpec::findings).
[[nodiscard]] std::optional<Finding> documented_finding(const VariantSpec& variant,
                                                        const scenarios::Scenario& scenario,
                                                        const ContractFacts& facts);

// "torchtune@bd2a0fc7 recipes/x.py:10-20 (what)".
[[nodiscard]] std::string to_string(const Citation& citation);
[[nodiscard]] std::string_view to_string(Role role);

}  // namespace gradnorm::harness
