#pragma once
// The float64 reference (docs/design.md §1-2): every valid token of every rank and
// micro-batch in one batch; the model's float64 forward (a copy of the same initial
// parameters) and the loss's unreduced per-token values; then its own sum over the step and
// division by N, its own norm, clip and optimizer arithmetic. It shares no normalisation
// code with the steps it judges: the model and the per-token loss are all they share.

#include <string>
#include <vector>

#include "gradnorm/harness/loss.hpp"
#include "gradnorm/harness/model.hpp"
#include "gradnorm/harness/observation.hpp"
#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::oracles {

struct OracleStep {
  std::vector<harness::NamedTensor> gradients;  // clip_coef * g*, what the optimizer consumes
  double total_norm = 0;                        // ||g*||_2 before clipping
  double clip_coef = 1;                         // min(1, max_norm / (total_norm + 1e-6))
  double loss = 0;                              // L*, the loss a recipe should log
  std::vector<harness::NamedTensor> parameters_before;  // where this step started (float64)
  std::vector<harness::NamedTensor> parameters_after;
};

struct OracleResult {
  long global_token_count = 0;  // N of the first step
  // N == 0: no gradient exists; the step must signal an error (docs/design.md §3).
  bool no_gradient = false;
  std::string contract;  // one line: what the contract says for this scenario
  std::vector<harness::NamedTensor> initial_parameters;  // float64
  std::vector<OracleStep> steps;
};

// `objective`: what the step's recipe optimises per token (the scenario's loss, or
// distillation from the frozen teacher that ModelConfig::teacher describes).
//
// `anchor`: the observation being judged. Each step after the first then starts from the
// parameters the observed step before it left (in float64), where they are finite, so every
// step is judged from where it really started; the optimizer's state (momentum, moments,
// step count) stays the oracle's own. Without it the oracle follows its own float64
// trajectory, and the rounding of the step's storage compounds over steps into a gap no
// tolerance states (docs/design.md §2: float32 AdamW at lr 0.5 drifts past 1e-5 at step 13).
[[nodiscard]] OracleResult run_oracle(
    const scenarios::Scenario& scenario, const harness::ModelConfig& model,
    harness::Objective objective = harness::Objective::scenario_loss,
    const harness::Observation* anchor = nullptr);

}  // namespace gradnorm::oracles
