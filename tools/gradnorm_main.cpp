// gradnorm: runs named scenarios x recipe variants against the float64 oracle.
// Exit codes: 0 every row as expected, 1 some verdict was not what was expected,
// 2 usage or input error.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <set>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/harness/variant.hpp"
#include "gradnorm/oracles/evaluation.hpp"
#include "gradnorm/oracles/oracle.hpp"
#include "gradnorm/oracles/token_weights.hpp"
#include "gradnorm/reports/report.hpp"
#include "gradnorm/scenarios/catalogue.hpp"

namespace {

using namespace gradnorm;

constexpr int kExitAsExpected = 0;
constexpr int kExitUnexpected = 1;
constexpr int kExitUsage = 2;

std::vector<scenarios::Scenario> pick_scenarios(const std::vector<std::string>& patterns) {
  if (patterns.empty()) return scenarios::catalogue();
  std::set<std::string> wanted;
  for (const std::string& pattern : patterns) {
    for (const scenarios::Scenario& s : scenarios::select_scenarios(pattern)) wanted.insert(s.name);
  }
  std::vector<scenarios::Scenario> out;
  for (const scenarios::Scenario& s : scenarios::catalogue()) {
    if (wanted.count(s.name)) out.push_back(s);
  }
  return out;
}

std::vector<harness::VariantSpec> pick_variants(const std::vector<std::string>& patterns) {
  if (patterns.empty()) return harness::variants();
  std::set<std::string> wanted;
  for (const std::string& pattern : patterns) {
    for (const harness::VariantSpec& v : harness::select_variants(pattern)) wanted.insert(v.name);
  }
  std::vector<harness::VariantSpec> out;
  for (const harness::VariantSpec& v : harness::variants()) {
    if (wanted.count(v.name)) out.push_back(v);
  }
  return out;
}

struct RunOptions {
  std::vector<std::string> scenario_patterns;
  std::vector<std::string> variant_patterns;
  std::string json_path;
  std::string markdown_path;
  bool quiet = false;
  bool ignore_findings = false;
};

int run_command(const RunOptions& options) {
  const auto scenario_list = pick_scenarios(options.scenario_patterns);
  const auto variant_list = pick_variants(options.variant_patterns);
  harness::DeterminismGuard guard;
  const oracles::Evaluation evaluation = oracles::evaluate(
      scenario_list, variant_list,
      oracles::EvaluateOptions{.use_documented_findings = !options.ignore_findings});
  // Reports are complete before anything is printed as done; each is written atomically.
  if (!options.json_path.empty()) {
    reports::write_file_atomically(
        options.json_path, reports::to_json(evaluation, guard.settings()).dump(2) + "\n");
  }
  if (!options.markdown_path.empty()) {
    reports::write_file_atomically(options.markdown_path,
                                   reports::render_markdown(evaluation, guard.settings()));
  }
  const std::string table = reports::render_table(evaluation);
  if (options.quiet) {
    std::fputs(table.substr(table.rfind("\n", table.size() - 2) + 1).c_str(), stdout);
  } else {
    std::fputs(table.c_str(), stdout);
  }
  return evaluation.all_met() ? kExitAsExpected : kExitUnexpected;
}

int list_command(bool scenarios_only, bool variants_only) {
  if (!variants_only) {
    for (const scenarios::Scenario& s : scenarios::catalogue()) {
      fmt::print("{}\n", scenarios::describe(s));
    }
  }
  if (!scenarios_only) {
    for (const harness::VariantSpec& v : harness::variants()) {
      fmt::print("{:<32} {:<17} {}\n", v.name, harness::to_string(v.role), v.models);
    }
  }
  return kExitAsExpected;
}

int show_command(const std::string& name) {
  const scenarios::Scenario& s = scenarios::find_scenario(name);
  fmt::print("{}\n", scenarios::describe(s));
  fmt::print("N = {} valid tokens; per rank:", s.global_token_count());
  for (int rank = 0; rank < s.world_size; ++rank) fmt::print(" {}", s.rank_token_count(rank));
  fmt::print("\n");
  harness::DeterminismGuard guard;
  const oracles::OracleResult oracle =
      oracles::run_oracle(s, harness::model_config_for(harness::find_variant("baseline"), s));
  fmt::print("contract: {}\n", oracle.contract);
  for (std::size_t step = 0; step < oracle.steps.size(); ++step) {
    fmt::print("oracle step {}: loss {:.9g}, grad norm {:.9g}, clip coef {:.6g}\n", step,
               oracle.steps[step].loss, oracle.steps[step].total_norm, oracle.steps[step].clip_coef);
  }
  for (const scenarios::ExpectedVerdict& e : s.expected_verdicts) {
    fmt::print("documented finding: {} -> {}: {}\n", e.variant_pattern, e.verdict, e.reason);
  }
  return kExitAsExpected;
}

std::string weight_range(const std::vector<double>& weights) {
  if (weights.empty()) return "-";
  const auto [low, high] = std::minmax_element(weights.begin(), weights.end());
  if (*low == *high) return fmt::format("{:.6g}", *low);
  return fmt::format("{:.6g} .. {:.6g}", *low, *high);
}

int explain_command(const std::string& name, const std::vector<std::string>& variant_patterns) {
  const scenarios::Scenario& s = scenarios::find_scenario(name);
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gradnorm: proves whether a training step normalises losses and gradients like "
               "a float64 oracle"};
  app.require_subcommand(1);

  RunOptions run_options;
  CLI::App* run = app.add_subcommand("run", "run scenarios x variants and print the verdicts");
  run->add_option("--scenario,-s", run_options.scenario_patterns,
                  "scenario name or shell pattern (repeatable; default: the whole catalogue)");
  run->add_option("--variant,-v", run_options.variant_patterns,
                  "variant name or shell pattern (repeatable; default: every variant)");
  run->add_option("--json", run_options.json_path, "write one JSON record per row to PATH");
  run->add_option("--markdown", run_options.markdown_path, "write a pull-request report to PATH");
  run->add_flag("--quiet,-q", run_options.quiet, "print the summary line only");
  run->add_flag("--ignore-findings", run_options.ignore_findings,
                "treat documented findings as failures: every reference and candidate must "
                "agree with the oracle");

  bool scenarios_only = false, variants_only = false;
  CLI::App* list = app.add_subcommand("list", "list the scenario catalogue and the variants");
  list->add_flag("--scenarios", scenarios_only, "scenarios only");
  list->add_flag("--variants", variants_only, "variants only");

  std::string show_name;
  CLI::App* show = app.add_subcommand("show", "describe one scenario and its oracle");
  show->add_option("scenario", show_name, "scenario name")->required();

  std::string explain_name;
  std::vector<std::string> explain_variants;
  CLI::App* explain = app.add_subcommand(
      "explain", "print each variant's effective per-token weight, per rank, against 1/N");
  explain->add_option("scenario", explain_name, "scenario name")->required();
  explain->add_option("--variant,-v", explain_variants,
                      "variant name or pattern (repeatable; default: baseline, skip, "
                      "world-size-only, global-prenorm)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? kExitAsExpected : kExitUsage;
  }
  try {
    if (*run) return run_command(run_options);
    if (*list) return list_command(scenarios_only, variants_only);
    if (*show) return show_command(show_name);
    if (*explain) return explain_command(explain_name, explain_variants);
  } catch (const scenarios::InvalidInput& error) {
    fmt::print(stderr, "gradnorm: {}\n", error.what());
    return kExitUsage;
  }
  return kExitUsage;
}
