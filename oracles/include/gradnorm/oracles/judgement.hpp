#pragma once
// One step judged on one scenario, the way a test of a user's step wants it: did it agree
// with the oracle, did its reference, and if not, why (verdict, worst element, and the
// per-token weights it gave against 1/N). The GoogleTest and rapidcheck helpers in
// gradnorm/testing/ are thin wrappers over this.

#include <optional>
#include <string>
#include <vector>

#include "gradnorm/oracles/evaluation.hpp"
#include "gradnorm/oracles/token_weights.hpp"

namespace gradnorm::oracles {

struct Judgement {
  EvaluationRow row;                          // the step's own row
  std::optional<EvaluationRow> reference_row; // its reference's, when that is another step
  // Agreement: pass, or the expected error (N == 0, or a refusal its reference shares).
  [[nodiscard]] bool agrees() const;
  [[nodiscard]] bool reference_agrees() const;
  // Check by check (scenarios::kCheckNames): the checks this case holds the step to, those
  // its reference did not fail and the step's run could be measured on (numbers only where
  // a gradient exists and the step did not raise, the norm only with clipping, ranks-agree
  // only with ranks; nothing where the reference's run aborted). A reference's documented
  // weakness (its NaN logged loss after an empty micro-batch) so removes only its own check.
  [[nodiscard]] std::vector<std::string> judged_checks() const;
  // The judged checks the step failed, and "run" when the step's own run aborted. Empty:
  // the step agrees with the oracle wherever its reference does.
  [[nodiscard]] std::vector<std::string> disagreements() const;
};

// Runs `variant` and its reference on `scenario` (ranks as threads) and judges both.
// Throws scenarios::InvalidInput for an unknown variant, an invalid scenario or a pair
// the step cannot run.
[[nodiscard]] Judgement judge_step(const std::string& variant, const scenarios::Scenario& scenario);

// Several lines: the scenario, the verdict and its reasons, the worst gradient element,
// and (with probe_weights) each rank's per-token weights read with the token-probe model
// against the contract's 1/N.
[[nodiscard]] std::string explain(const Judgement& judgement, bool probe_weights = true);

// Just the per-token weights part of explain().
[[nodiscard]] std::string explain_weights(const TokenWeightReport& report);

}  // namespace gradnorm::oracles
