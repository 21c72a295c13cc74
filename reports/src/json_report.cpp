#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>

#include "gradnorm/harness/transport.hpp"
#include "gradnorm/reports/report.hpp"
#include "gradnorm/scenarios/files.hpp"
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
      {"failed_checks", v.failed_checks},
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

json to_json(const oracles::Evaluation& evaluation, const harness::RunSettings& settings,
             const std::vector<std::string>& reproduce_arguments) {
  const Summary s = summarize(evaluation);
  json records = json::array();
  for (const oracles::EvaluationRow& row : evaluation.rows) records.push_back(record(row));
  // What each variant is, in one line: for real framework code, the framework and version
  // judged ("transformers 5.18.0's Trainer, unmodified (...)").
  json variants = json::object();
  for (const oracles::EvaluationRow& row : evaluation.rows) variants[row.variant.name] = row.variant.summary;
  json left_out = json::array();
  for (const oracles::SkippedPair& pair : evaluation.skipped) {
    left_out.push_back({{"scenario", pair.scenario}, {"variant", pair.variant}, {"why", pair.why}});
  }
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
      {"run", {{"reproduce_arguments", reproduce_arguments}}},
      {"variants", variants},
      {"records", records},
      {"left_out", left_out},
  };
}

namespace {

// The named temporary a fallback write is using, for the signal handler to remove.
char g_partial[4096] = "";

}  // namespace

void remove_partial_report() noexcept {
  if (g_partial[0] != '\0') ::unlink(g_partial);
}

void write_file_atomically(const std::string& given, const std::string& text) {
  auto fail = [&given](const std::string& why) {
    return ReportWriteError("cannot write '" + given + "': " + why);
  };
  // Checked again at write time (the commands check before any work): what is not a regular
  // file is never replaced, and a symbolic link to one is written through, not replaced.
  if (auto why = scenarios::why_unwritable(given)) throw fail(*why);
  std::string path = given;
  struct stat link {};
  if (::lstat(given.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    std::error_code error;
    const std::filesystem::path resolved = std::filesystem::canonical(given, error);
    if (!error) path = resolved.string();
  }
  const std::filesystem::path target(path);
  const std::string folder = target.has_parent_path() ? target.parent_path().string() : ".";
  auto write_all = [&](int fd) {
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      done += static_cast<std::size_t>(n);
    }
    return ::fsync(fd) == 0;
  };
  // An unnamed file in the target's folder, given its name only once complete: a run killed
  // at any moment, even by SIGKILL, leaves no half-written report and no temporary behind.
  const int fd = ::open(folder.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
  if (fd >= 0) {
    const bool written = write_all(fd);
    const std::string proc = fmt::format("/proc/self/fd/{}", fd);
    if (!written) {
      ::close(fd);
      throw fail(std::strerror(errno));
    }
    if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW) == 0) {
      ::close(fd);
      return;
    }
    if (errno != EEXIST) {
      const int error = errno;
      ::close(fd);
      throw fail(std::strerror(error));
    }
    // The report exists: link under a temporary name, then rename over it (atomic).
    const std::string temporary = fmt::format("{}.partial.{}", path, ::getpid());
    ::unlink(temporary.c_str());
    if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, temporary.c_str(), AT_SYMLINK_FOLLOW) != 0 ||
        std::rename(temporary.c_str(), path.c_str()) != 0) {
      const int error = errno;
      ::unlink(temporary.c_str());
      ::close(fd);
      throw fail(std::strerror(error));
    }
    ::close(fd);
    return;
  }
  // A file system without unnamed files: a named temporary, removed on failure and by the
  // command line's signal handler (remove_partial_report) on an interrupt.
  const std::string temporary = fmt::format("{}.partial.{}", path, ::getpid());
  if (temporary.size() >= sizeof(g_partial)) throw fail("the path is too long");
  std::memcpy(g_partial, temporary.c_str(), temporary.size() + 1);
  const int named = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (named < 0) {
    g_partial[0] = '\0';
    throw fail("the folder is missing or not writable");
  }
  const bool written = write_all(named);
  ::close(named);
  if (!written || std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    g_partial[0] = '\0';
    throw fail(std::strerror(error));
  }
  g_partial[0] = '\0';
}

}  // namespace gradnorm::reports
