#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "gradnorm/harness/transport.hpp"
#include "gradnorm/reports/report.hpp"
#include "gradnorm/oracles/tolerance.hpp"

namespace gradnorm::reports {
namespace {

using nlohmann::json;

json number(double value) { return std::isfinite(value) ? json(value) : json(nullptr); }
json number(const std::optional<double>& value) { return value ? number(*value) : json(nullptr); }
json ulps(std::int64_t value) {
  return value == std::numeric_limits<std::int64_t>::max() ? json("max") : json(value);
}

json metrics(const oracles::ErrorMetrics& m) {
  return {{"rel_l2_error", number(m.rel_l2_error)}, {"max_abs_error", number(m.max_abs_error)},
          {"max_ulp", ulps(m.max_ulp)},             {"cosine", number(m.cosine)},
          {"all_finite", m.all_finite},             {"complete", m.complete},
          {"worst", m.worst}};
}

json record(const oracles::EvaluationRow& row) {
  const harness::Observation& o = row.observation;
  const oracles::Verdict& v = row.verdict;
  const bool numbers = v.kind == oracles::VerdictKind::pass || v.kind == oracles::VerdictKind::fail;
  json steps = json::array();
  for (const harness::StepRecord& step : o.steps) {
    steps.push_back({{"logged_loss", number(step.logged_loss)}, {"grad_norm", number(step.grad_norm)}});
  }
  const harness::StepRecord* first = o.steps.empty() ? nullptr : &o.steps.front();
  return {
      {"scenario", row.scenario.name},
      {"variant", row.variant.name},
      {"role", harness::to_string(row.variant.role)},
      {"reference", row.variant.reference},
      {"dtype", scenarios::to_string(row.scenario.dtype)},
      {"global_token_count", row.global_token_count},
      {"verdict", oracles::to_string(v.kind)},
      {"expectation", oracles::to_string(row.expectation)},
      {"met", row.met},
      {"why", row.applicability},
      {"reasons", v.reasons},
      {"notes", v.notes},
      {"outcome", v.outcome},
      {"rel_l2_error", numbers ? number(v.gradients.rel_l2_error) : json(nullptr)},
      {"max_abs_error", numbers ? number(v.gradients.max_abs_error) : json(nullptr)},
      {"max_ulp", numbers ? ulps(v.gradients.max_ulp) : json(nullptr)},
      {"gradients", numbers ? metrics(v.gradients) : json(nullptr)},
      {"updates", numbers ? metrics(v.updates) : json(nullptr)},
      {"logged_loss_rel_error", number(v.logged_loss_rel_error)},
      {"grad_norm_rel_error", number(v.grad_norm_rel_error)},
      {"bitwise_equal_baseline", row.against_reference.bitwise_equal},
      {"max_ulp_vs_baseline", ulps(row.against_reference.max_ulp)},
      {"first_difference_vs_baseline", row.against_reference.first_difference},
      {"world_size", row.world_size},
      {"observation_digest", fmt::format("{:016x}", harness::digest(o))},
      {"grad_norm", first ? number(first->grad_norm) : json(nullptr)},
      {"logged_loss", first ? number(first->logged_loss) : json(nullptr)},
      {"oracle_loss", number(row.oracle_loss)},
      {"oracle_grad_norm", number(row.oracle_grad_norm)},
      {"steps", steps},
      {"error", o.error ? json{{"type", o.error->type}, {"message", o.error->message}}
                        : json(nullptr)},
      {"counters",
       {{"backward_calls", o.counters.backward_calls},
        {"scale_passes", o.counters.scale_passes},
        {"clip_calls", o.counters.clip_calls},
        {"optimizer_steps", o.counters.optimizer_steps}}},
      {"tolerance",
       {{"tensor_rel_l2", oracles::tolerance_for(row.scenario.dtype).tensor_rel_l2},
        {"scalar_rel", oracles::tolerance_for(row.scenario.dtype).scalar_rel}}},
  };
}

}  // namespace

json to_json(const oracles::Evaluation& evaluation, const harness::RunSettings& settings) {
  const Summary s = summarize(evaluation);
  json records = json::array();
  for (const oracles::EvaluationRow& row : evaluation.rows) records.push_back(record(row));
  return {
      {"schema", kJsonSchemaVersion},
      {"tool", "gradnorm"},
      {"settings",
       {{"torch_version", settings.torch_version},
        {"intra_op_threads", settings.intra_op_threads},
        {"transport", settings.transport},
        {"deterministic_algorithms", settings.deterministic_algorithms}}},
      {"summary",
       {{"rows", s.rows}, {"pass", s.passed}, {"fail", s.failed},
        {"expected_error", s.expected_errors}, {"error_mismatch", s.error_mismatches},
        {"unexpected", s.unmet}, {"negative_controls_visible", s.controls_visible},
        {"negative_controls_caught", s.controls_caught}, {"findings_reproduced", s.findings}}},
      {"records", records},
  };
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".partial";
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    if (!file) throw scenarios::InvalidInput("cannot write report '" + path + "': the folder is missing or not writable");
    file << text;
    file.flush();
    if (!file) {
      std::remove(temporary.c_str());
      throw scenarios::InvalidInput("cannot write report '" + path + "': write failed");
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    throw scenarios::InvalidInput("cannot write report '" + path + "': rename failed");
  }
}

}  // namespace gradnorm::reports
