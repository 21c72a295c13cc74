#pragma once
// One step judged on one scenario, the way a test of a user's step wants it: did it agree
// with the oracle, did its reference, and if not, why (verdict, worst element, and the
// per-token weights it gave against 1/N). The GoogleTest and rapidcheck helpers in
// gradnorm/testing/ are thin wrappers over this.

#include <optional>
#include <string>

#include "gradnorm/oracles/evaluation.hpp"
#include "gradnorm/oracles/token_weights.hpp"

namespace gradnorm::oracles {

struct Judgement {
  EvaluationRow row;                          // the step's own row
  std::optional<EvaluationRow> reference_row; // its reference's, when that is another step
  // Agreement: pass, or the expected error (N == 0, or a refusal its reference shares).
  [[nodiscard]] bool agrees() const;
  [[nodiscard]] bool reference_agrees() const;
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
