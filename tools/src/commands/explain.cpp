// `gradnorm explain SCENARIO`: each variant's effective per-token weight, per rank, against 1/N.
#include <fmt/format.h>

#include <algorithm>

#include "../command_line.hpp"
#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/oracles/token_weights.hpp"

namespace gradnorm::tools {
namespace {

std::string weight_range(const std::vector<double>& weights) {
  if (weights.empty()) return "-";
  const auto [low, high] = std::minmax_element(weights.begin(), weights.end());
  if (*low == *high) return fmt::format("{:.6g}", *low);
  return fmt::format("{:.6g} .. {:.6g}", *low, *high);
}

int explain_command(const std::string& name, const std::vector<std::string>& variant_patterns,
                    const std::vector<std::string>& files) {
  const auto pool = scenario_pool(files, false);
  const scenarios::Scenario& s = find_named(pool, name);
  std::vector<std::string> patterns = variant_patterns;
  if (patterns.empty()) patterns = {"baseline", "skip", "world-size-only", "global-prenorm"};
  const auto variant_list = pick_variants(patterns);
  harness::DeterminismGuard guard;
  fmt::print("{}: W={}, N={}; tokens per rank:", s.name, s.world_size, s.global_token_count());
  for (int rank = 0; rank < s.world_size; ++rank) fmt::print(" {}", s.rank_token_count(rank));
  fmt::print("\nToken-weight probe: one zero-initialised parameter row per token position, so each\n"
             "token's gradient is its own row and its weight is read off exactly.\n\n");
  fmt::print("{:<32} {:>5} {:>7} {:>14} {:>22} {:>9}\n", "variant", "rank", "tokens", "expected",
             "observed", "ratio");
  for (const harness::VariantSpec& v : variant_list) {
    if (auto why = harness::not_applicable(v, s)) {
      fmt::print("{:<32} not applicable: {}\n", v.name, *why);
      continue;
    }
    const oracles::TokenWeightReport report = oracles::probe_token_weights(s, v);
    if (report.outcome != "ok") {
      fmt::print("{:<32} {}\n", v.name, report.outcome);
      continue;
    }
    for (const oracles::RankTokenWeights& rank : report.ranks) {
      std::string ratio = "-";
      if (!rank.weights.empty()) {
        const auto [low, high] = std::minmax_element(rank.weights.begin(), rank.weights.end());
        ratio = *low == *high ? fmt::format("{:.4g}", *low / report.expected_weight)
                              : fmt::format("{:.4g}..{:.4g}", *low / report.expected_weight,
                                            *high / report.expected_weight);
      }
      fmt::print("{:<32} {:>5} {:>7} {:>14.6g} {:>22} {:>9}\n", v.name, rank.rank, rank.tokens,
                 report.expected_weight, weight_range(rank.weights), ratio);
    }
    fmt::print("{:<32} weights rel L2 error {:.4g} (orthogonal per-token gradients)\n", v.name,
               report.rel_l2_error);
  }
  return kExitAsExpected;
}

class ExplainCommand : public Subcommand {
 public:
  explicit ExplainCommand(CLI::App& app) : Subcommand(nullptr) {
    app_ = app.add_subcommand(
        "explain", "print each variant's effective per-token weight, per rank, against 1/N");
    app_->footer("The guide: docs/judging.md.");
    app_->add_option("scenario", name_, "scenario name")->required();
    app_->add_option("--scenario-file,-f", files_, "TOML scenario file (repeatable)")
        ->check(readable_file());
    app_->add_option("--variant,-v", variants_,
                        "variant name or pattern (repeatable; default: baseline, skip, "
                        "world-size-only, global-prenorm)");
  }

  int run() override {
    return explain_command(name_, variants_, files_);
  }

 private:
  std::string name_;
  std::vector<std::string> variants_, files_;
};

}  // namespace

std::unique_ptr<Subcommand> add_explain_command(CLI::App& app) { return std::make_unique<ExplainCommand>(app); }

}  // namespace gradnorm::tools
