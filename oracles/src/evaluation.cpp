#include "gradnorm/oracles/evaluation.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <limits>
#include <map>
#include <thread>

#include "gradnorm/harness/dtype.hpp"
#include "gradnorm/harness/output_capture.hpp"
#include "gradnorm/harness/runner.hpp"

namespace gradnorm::oracles {
namespace {

// A check that fails because a named one does: the update is made of the gradients (and
// clipped by their norm), the clipped norm is the gradients' norm, and past the first step
// a wrong update starts every later step from other parameters, so its logged loss differs.
// Anything else failing on a finding's row is a second fault.
bool follows_from(const std::string& check, const std::vector<std::string>& named, int steps) {
  auto has = [&](std::string_view c) { return std::find(named.begin(), named.end(), c) != named.end(); };
  const bool wrong_update = has("gradients") || has("grad-norm") || has("parameter-update");
  if (check == "parameter-update") return wrong_update;
  if (check == "grad-norm") return has("gradients") || (steps > 1 && wrong_update);
  if (check == "gradients" || check == "logged-loss") return steps > 1 && wrong_update;
  return false;
}

// What the oracle says about the scenario, for a control's bug_visible rule.
harness::ContractFacts contract_facts(const scenarios::Scenario& s, const OracleResult& oracle) {
  harness::ContractFacts facts;
  facts.global_token_count = oracle.global_token_count;
  if (s.clip_max_norm && !oracle.steps.empty()) facts.first_clip_coef = oracle.steps.front().clip_coef;
  return facts;
}

struct OracleKey {
  std::string scenario;
  scenarios::ModelKind base;
  bool lora;
  bool fake_quantize;
  harness::Objective objective;
  auto operator<=>(const OracleKey&) const = default;
};

}  // namespace

bool Evaluation::all_met() const { return count_unmet() == 0; }

int Evaluation::count_unmet() const {
  int unmet = 0;
  for (const EvaluationRow& row : rows) unmet += row.met ? 0 : 1;
  return unmet;
}

namespace {

// One scenario against every variant: its rows and left-out pairs, up to a fault.
Evaluation evaluate_scenario(const scenarios::Scenario& s,
                             const std::vector<harness::VariantSpec>& variant_list,
                             const EvaluateOptions& options, harness::Transport& transport) {
  Evaluation out;
  std::map<OracleKey, OracleResult> oracles;
  std::map<std::string, harness::RankedRun> observed;
  auto observe = [&](const harness::VariantSpec& v) -> const harness::RankedRun& {
    auto found = observed.find(v.name);
    if (found == observed.end()) found = observed.emplace(v.name, transport.run(v, s)).first;
    return found->second;
  };
  for (const harness::VariantSpec& v : variant_list) {
    if (auto why = harness::not_applicable(v, s)) {
      out.skipped.push_back({s.name, v.name, *why});
      continue;
    }
    const harness::ModelConfig config = harness::model_config_for(v, s);
    const OracleKey key{s.name, config.base, config.lora, config.fake_quantize, v.objective};
    auto oracle = oracles.find(key);
    if (oracle == oracles.end()) {
      oracle = oracles.emplace(key, run_oracle(s, config, v.objective)).first;
    }

    EvaluationRow row;
    row.scenario = s;
    row.variant = v;
    row.world_size = s.world_size;
    const harness::RankedRun& run = observe(v);
    const harness::RankedRun& reference = observe(harness::find_variant(v.reference));
    row.fault = run.fault;
    if (!row.fault && reference.fault) row.fault = "reference " + v.reference + ": " + *reference.fault;
    if (!run.ranks.empty()) row.observation = run.ranks.front();
    for (const harness::Observation& rank : run.ranks) {
      row.rank_digests.push_back(harness::digest(rank));
      row.output += run.ranks.size() == 1
                        ? rank.output
                        : harness::prefix_lines(rank.output, fmt::format("[rank {}] ", rank.rank));
    }
    // Past the first step the oracle starts each step where rank 0's observed one did
    // (oracle.hpp): one float64 run per row then, not per scenario.
    std::optional<OracleResult> anchored;
    if (s.steps > 1 && !run.ranks.empty() && !oracle->second.no_gradient) {
      anchored = run_oracle(s, config, v.objective, &run.ranks.front());
    }
    row.verdict = judge_ranks(s, run, anchored ? *anchored : oracle->second, reference);
    row.global_token_count = oracle->second.global_token_count;
    const bool has_step = !oracle->second.steps.empty();
    row.oracle_loss = has_step ? oracle->second.steps.front().loss
                               : std::numeric_limits<double>::quiet_NaN();
    row.oracle_grad_norm = has_step ? oracle->second.steps.front().total_norm
                                    : std::numeric_limits<double>::quiet_NaN();
    if (v.name != v.reference && !run.fault && !reference.fault && !reference.ranks.empty()) {
      row.against_reference = compare_observations(row.observation, reference.ranks.front(),
                                                   harness::scalar_type(s.dtype));
    } else {
      row.against_reference.bitwise_equal = v.name == v.reference;
    }
    const bool agreed = row.verdict.kind == VerdictKind::pass ||
                        row.verdict.kind == VerdictKind::expected_error;
    if (v.role == harness::Role::negative_control) {
      const harness::Visibility visibility = v.bug_visible(s, contract_facts(s, oracle->second));
      row.applicability = visibility.why;
      row.expectation = visibility.visible ? Expectation::flag : Expectation::not_applicable;
      row.met = !visibility.visible || !agreed;
    } else if (const std::optional<harness::Finding> finding =
                   options.use_documented_findings
                       ? harness::documented_finding(v, s, contract_facts(s, oracle->second))
                       : std::nullopt) {
      row.expectation = Expectation::finding;
      row.applicability = finding->reason;
      // The verdict, and no failed check past those the finding names (and what follows from
      // them): another check failing on the row is a second bug, not the documented one.
      std::vector<std::string> expected = finding->checks;
      if (expected.empty() && finding->verdict == "error-mismatch") expected = {"error-behaviour"};
      std::sort(expected.begin(), expected.end());
      expected.erase(std::unique(expected.begin(), expected.end()), expected.end());
      const bool same_kind = to_string(row.verdict.kind) == finding->verdict;
      const std::vector<std::string>& failed = row.verdict.failed_checks;
      const bool nothing_else = std::all_of(failed.begin(), failed.end(), [&](const std::string& c) {
        return std::binary_search(expected.begin(), expected.end(), c) || follows_from(c, expected, s.steps);
      });
      row.met = same_kind && nothing_else;
      if (same_kind && !row.met) {
        row.applicability += fmt::format(" [the finding fails {}; this row fails {}]",
                                         expected.empty() ? "no check" : fmt::format("{}", fmt::join(expected, ", ")),
                                         row.verdict.failed_checks.empty()
                                             ? "no check"
                                             : fmt::format("{}", fmt::join(row.verdict.failed_checks, ", ")));
      }
    } else {
      row.expectation = Expectation::agree;
      row.met = agreed;
    }
    // A fault is never an answer: not a caught control, not a reproduced finding. The
    // evaluation stops: the rest of the matrix would run on a broken setup.
    if (row.fault) {
      row.met = false;
      out.fault = fmt::format("{} x {}: {}", s.name, v.name, *row.fault);
    }
    out.rows.push_back(std::move(row));
    if (out.fault) return out;
  }
  return out;
}

}  // namespace

Evaluation evaluate(const std::vector<scenarios::Scenario>& scenario_list,
                    const std::vector<harness::VariantSpec>& variant_list,
                    const EvaluateOptions& options) {
  harness::RunOptions thread_options;
  thread_options.timeout = options.timeout;
  harness::ThreadTransport threads(thread_options);
  harness::Transport& transport = options.transport ? *options.transport : threads;
  // Ranks as processes run every scenario in step with their peers: one at a time.
  const bool in_process = transport.kind() == "threads";
  const std::size_t workers = in_process
      ? std::min<std::size_t>(static_cast<std::size_t>(std::max(1, options.workers)), scenario_list.size())
      : 1;
  std::vector<Evaluation> parts(scenario_list.size());
  std::vector<std::exception_ptr> errors(scenario_list.size());
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> first_fault{scenario_list.size()};
  auto work = [&] {
    for (std::size_t i = next++; i < scenario_list.size(); i = next++) {
      // Past a fault (or an error) nothing more is needed.
      if (i > first_fault.load()) return;
      try {
        parts[i] = evaluate_scenario(scenario_list[i], variant_list, options, transport);
        if (parts[i].fault) {
          std::size_t known = first_fault.load();
          while (i < known && !first_fault.compare_exchange_weak(known, i)) {
          }
        }
      } catch (...) {
        errors[i] = std::current_exception();
        std::size_t known = first_fault.load();
        while (i < known && !first_fault.compare_exchange_weak(known, i)) {
        }
      }
    }
  };
  if (workers <= 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (std::size_t w = 0; w < workers; ++w) pool.emplace_back(work);
    for (std::thread& t : pool) t.join();
  }
  Evaluation out;
  for (std::size_t i = 0; i < scenario_list.size(); ++i) {
    if (errors[i]) std::rethrow_exception(errors[i]);
    for (EvaluationRow& row : parts[i].rows) out.rows.push_back(std::move(row));
    for (auto& skipped : parts[i].skipped) out.skipped.push_back(std::move(skipped));
    if (parts[i].fault) {
      out.fault = parts[i].fault;
      return out;
    }
  }
  return out;
}

std::string_view to_string(Expectation expectation) {
  switch (expectation) {
    case Expectation::agree: return "agree";
    case Expectation::flag: return "flag";
    case Expectation::not_applicable: return "n/a";
    case Expectation::finding: return "finding";
  }
  return "<unknown>";
}

}  // namespace gradnorm::oracles
