#pragma once
// The token-weight probe: runs a variant on the scenario's counts with the token_probe
// model, whose per-token gradients are orthogonal, and reads off the weight each valid token
// received in the gradient the optimizer consumed. The contract weight is 1/N.

#include <string>
#include <vector>

#include "gradnorm/harness/runner.hpp"
#include "gradnorm/harness/variant.hpp"

namespace gradnorm::oracles {

struct RankTokenWeights {
  int rank = 0;
  long tokens = 0;                // n_r
  std::vector<double> weights;    // one per valid token, in (micro-batch, sequence, position) order
};

struct TokenWeightReport {
  std::string scenario;
  std::string variant;
  long global_token_count = 0;          // N
  double expected_weight = 0;           // 1/N (times the oracle's clip coefficient)
  std::vector<RankTokenWeights> ranks;  // empty when the run raised or faulted
  std::string outcome;                  // "ok", or why no weight could be read
  double rel_l2_error = 0;              // of the weights against expected_weight
};

// `scenario` keeps its counts, dtype, loss and clipping; its model becomes token_probe.
[[nodiscard]] TokenWeightReport probe_token_weights(const scenarios::Scenario& scenario,
                                                    const harness::VariantSpec& variant,
                                                    const harness::RunOptions& options = {});

}  // namespace gradnorm::oracles
