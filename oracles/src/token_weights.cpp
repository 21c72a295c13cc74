#include "gradnorm/oracles/token_weights.hpp"

#include <ATen/ATen.h>

#include <cmath>

#include "gradnorm/harness/batch.hpp"
#include "gradnorm/oracles/oracle.hpp"

namespace gradnorm::oracles {

TokenWeightReport probe_token_weights(const scenarios::Scenario& original,
                                      const harness::VariantSpec& variant,
                                      const harness::RunOptions& options) {
  scenarios::Scenario s = original;
  s.model = scenarios::ModelKind::token_probe;
  s.model_file.clear();  // the probe replaces a model from a file
  s.model_function.clear();
  s.steps = 1;
  TokenWeightReport report;
  report.scenario = original.name;
  report.variant = variant.name;
  report.global_token_count = s.global_token_count();
  if (variant.objective != harness::Objective::scenario_loss) {
    // Row p of the gradient is read as w_p * (1/V - onehot(y_p)): cross-entropy's form only.
    report.outcome = "the probe reads cross-entropy gradients; this step distils";
    return report;
  }
  const OracleResult oracle = run_oracle(s, harness::model_config_for(variant, s));
  if (oracle.no_gradient) {
    report.outcome = "N == 0: no token has a weight";
    return report;
  }
  report.expected_weight = oracle.steps.front().clip_coef / static_cast<double>(report.global_token_count);

  const harness::RankedRun run = harness::run_in_threads(variant, s, options);
  if (run.fault) {
    report.outcome = "run aborted: " + *run.fault;
    return report;
  }
  const harness::Observation& rank0 = run.ranks.front();
  if (rank0.error || rank0.steps.empty() || !rank0.steps.front().gradients.front().value.defined()) {
    report.outcome = rank0.error ? "raised " + rank0.error->type + ": " + rank0.error->message
                                 : "the optimizer consumed no gradient";
    return report;
  }
  // Every rank holds the reduced gradient; rank 0's has every token's row.
  const at::Tensor table = rank0.steps.front().gradients.front().value.to(at::kDouble);
  const double uniform = 1.0 / static_cast<double>(s.vocab_size);
  double squares = 0, expected_squares = 0;
  for (int rank = 0; rank < s.data_parallel_size(); ++rank) {
    RankTokenWeights weights;
    weights.rank = rank;
    weights.tokens = s.rank_token_count(rank);
    for (int micro = 0; micro < s.accumulation_steps; ++micro) {
      const harness::MicroBatch batch = harness::make_micro_batch(s, rank, 0, micro);
      const auto rows = batch.inputs.accessor<long, 2>();
      const auto labels = batch.labels.accessor<long, 2>();
      for (long b = 0; b < batch.labels.size(0); ++b) {
        for (long t = 0; t < batch.labels.size(1); ++t) {
          if (labels[b][t] == harness::kIgnoreIndex) continue;
          // Row p of the gradient is w_p * (1/V - onehot(y_p)); its y_p entry is w_p (1/V - 1).
          const double entry = table[rows[b][t]][labels[b][t]].item<double>();
          const double weight = entry / (uniform - 1.0);
          weights.weights.push_back(weight);
          squares += std::pow(weight - report.expected_weight, 2);
          expected_squares += std::pow(report.expected_weight, 2);
        }
      }
    }
    report.ranks.push_back(std::move(weights));
  }
  report.rel_l2_error = std::sqrt(squares / expected_squares);
  report.outcome = "ok";
  return report;
}

}  // namespace gradnorm::oracles
