#pragma once
// Judges one observation against the oracle (and, for error behaviour, against the
// variant's reference). A mismatch is a result, never an exception.

#include <optional>
#include <string>
#include <vector>

#include "gradnorm/harness/observation.hpp"
#include "gradnorm/harness/runner.hpp"
#include "gradnorm/oracles/comparator.hpp"
#include "gradnorm/oracles/oracle.hpp"

namespace gradnorm::oracles {

enum class VerdictKind {
  pass,            // every step agrees with the oracle within the dtype's tolerance
  fail,            // a number disagrees: gradients, update, logged loss or clipped norm
  expected_error,  // no gradient exists (N == 0) or the recipe refuses the configuration,
                   // and the variant signals it the way its reference does
  error_mismatch,  // raised where it should not, signalled differently from its reference,
                   // or returned finite values where no gradient exists
};

struct Verdict {
  VerdictKind kind = VerdictKind::pass;
  std::vector<std::string> reasons;  // empty for pass; each names quantity, figure and bound
  // The checks that failed, by name (scenarios::kCheckNames, and "run" for an aborted run),
  // sorted: a documented finding must name exactly these.
  std::vector<std::string> failed_checks;
  std::string outcome;               // how the step ended: "finite", "raises c10::Error", ...
  ErrorMetrics gradients;            // against the oracle, worst over steps
  ErrorMetrics updates;              // parameter updates against the oracle's
  std::optional<double> logged_loss_rel_error;
  std::optional<double> grad_norm_rel_error;
  // Checks that could not be made, and why (e.g. an update below the storage dtype's
  // resolution). Not failures, but a pass with a note is weaker than one without.
  std::vector<std::string> notes;
};

// `reference` is the observation of the variant whose error behaviour `observed` must
// match (it may be `observed` itself).
[[nodiscard]] Verdict judge(const scenarios::Scenario& scenario,
                            const harness::Observation& observed, const OracleResult& oracle,
                            const harness::Observation& reference);

// Every rank judged against the oracle (and against the same rank of the reference run);
// the step passes only if every rank passes and all ranks hold bit-identical gradients,
// norms, losses and parameters. Disagreement between ranks is itself a failure. A run that
// faulted (a rank threw outside the recipe, exited or hung) is an error-mismatch naming it.
[[nodiscard]] Verdict judge_ranks(const scenarios::Scenario& scenario,
                                  const harness::RankedRun& observed, const OracleResult& oracle,
                                  const harness::RankedRun& reference);

// "finite", "raises <type>", or "non-finite <what>": the behaviour an error check compares.
[[nodiscard]] std::string outcome_of(const harness::Observation& observation);

[[nodiscard]] std::string_view to_string(VerdictKind kind);

}  // namespace gradnorm::oracles
