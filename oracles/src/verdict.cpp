#include "gradnorm/oracles/verdict.hpp"

#include <ATen/ATen.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "gradnorm/harness/dtype.hpp"
#include "gradnorm/oracles/tolerance.hpp"

namespace gradnorm::oracles {
namespace {

// Records a failed check once, keeping the list sorted.
void add_check(Verdict& v, std::string_view check) {
  const auto at = std::lower_bound(v.failed_checks.begin(), v.failed_checks.end(), check);
  if (at == v.failed_checks.end() || *at != check) v.failed_checks.insert(at, std::string(check));
}

bool finite_tensors(const std::vector<harness::NamedTensor>& tensors) {
  for (const harness::NamedTensor& t : tensors) {
    if (t.value.defined() && !all_finite(t.value)) return false;
  }
  return true;
}

// Every step's parameters finite, and some of them different from where the step began.
bool moved_finitely(const harness::Observation& o) {
  const std::vector<harness::NamedTensor>* before = &o.initial_parameters;
  bool moved = false;
  for (const harness::StepRecord& step : o.steps) {
    if (!finite_tensors(step.parameters_after)) return false;
    for (std::size_t i = 0; i < step.parameters_after.size() && i < before->size(); ++i) {
      const at::Tensor& a = step.parameters_after[i].value;
      const at::Tensor& b = (*before)[i].value;
      moved = moved || (a.defined() && b.defined() && !at::equal(a, b));
    }
    before = &step.parameters_after;
  }
  return moved;
}

// The larger error, NaN counting as the largest.
double worst_of(const std::optional<double>& so_far, double error) {
  if (std::isnan(error) || (so_far && std::isnan(*so_far))) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  return std::max(so_far.value_or(0), error);
}

double relative_error(double actual, double expected) {
  if (actual == expected) return 0;
  return std::abs(actual - expected) / std::max(std::abs(expected), 1e-300);
}

// The update a storage dtype can resolve: one ULP of every parameter after the step,
// relative to the size of the oracle's update.
double storage_allowance(const std::vector<harness::NamedTensor>& after,
                         const std::vector<harness::NamedTensor>& oracle_update,
                         scenarios::DType dtype) {
  double ulp_sq = 0, update_sq = 0;
  for (std::size_t i = 0; i < after.size(); ++i) {
    const at::Tensor value = after[i].value.to(at::kDouble).contiguous().reshape({-1});
    const double* v = value.data_ptr<double>();
    for (long k = 0; k < value.numel(); ++k) ulp_sq += std::pow(ulp_of(v[k], dtype), 2);
    update_sq += oracle_update[i].value.pow(2).sum().item<double>();
  }
  return update_sq == 0 ? 0 : std::sqrt(ulp_sq / update_sq);
}

void judge_numbers(const scenarios::Scenario& s, const harness::Observation& observed,
                   const OracleResult& oracle, Verdict& v) {
  const Tolerance& tolerance = tolerance_for(s.dtype);
  const c10::ScalarType dtype = harness::scalar_type(s.dtype);
  auto fail = [&](std::string_view check, std::string reason) {
    v.kind = VerdictKind::fail;
    add_check(v, check);
    v.reasons.push_back(std::move(reason));
  };
  if (observed.steps.size() != oracle.steps.size()) {
    fail("steps", fmt::format("completed {} of {} steps", observed.steps.size(), oracle.steps.size()));
  }
  for (std::size_t step = 0; step < std::min(observed.steps.size(), oracle.steps.size()); ++step) {
    const harness::StepRecord& got = observed.steps[step];
    const OracleStep& want = oracle.steps[step];

    const ErrorMetrics gradients = compare_tensors(got.gradients, want.gradients, dtype);
    v.gradients.merge(gradients);
    if (!gradients.complete) {
      fail("gradients", fmt::format("step {}: the optimizer consumed no gradient ({})", step, gradients.worst));
    } else if (!gradients.all_finite) {
      fail("gradients", fmt::format("step {}: non-finite gradients ({})", step, gradients.worst));
    } else if (gradients.rel_l2_error > tolerance.tensor_rel_l2) {
      fail("gradients", fmt::format("step {}: gradients rel L2 error {:.3g} > {:.0e} (worst {})", step,
                       gradients.rel_l2_error, tolerance.tensor_rel_l2, gradients.worst));
    }

    const auto& before = step == 0 ? observed.initial_parameters : observed.steps[step - 1].parameters_after;
    const auto& oracle_before = want.parameters_before;
    const auto oracle_update = updates(oracle_before, want.parameters_after);
    const ErrorMetrics update =
        compare_tensors(updates(before, got.parameters_after), oracle_update, at::kDouble);
    v.updates.merge(update);
    const double allowance = storage_allowance(got.parameters_after, oracle_update, s.dtype);
    // Past this, one ULP of storage is half the update itself: the update check could not
    // tell a step from no step, so it is reported as not made rather than passed.
    constexpr double kMaxAllowance = 0.5;
    if (!update.all_finite) {
      fail("parameter-update", fmt::format("step {}: non-finite parameters after the step ({})", step, update.worst));
    } else if (allowance > kMaxAllowance) {
      v.notes.push_back(fmt::format(
          "step {}: parameter update not checked: one ULP of {} storage is {:.2g} of the "
          "oracle's update",
          step, scenarios::to_string(s.dtype), allowance));
    } else if (update.rel_l2_error > tolerance.tensor_rel_l2 + allowance) {
      fail("parameter-update", fmt::format("step {}: parameter update rel L2 error {:.3g} > {:.0e} + {:.2g} for "
                       "{} storage (worst {})",
                       step, update.rel_l2_error, tolerance.tensor_rel_l2, allowance,
                       scenarios::to_string(s.dtype), update.worst));
    }

    if (!got.logged_loss) {
      fail("logged-loss", fmt::format("step {}: no loss was logged", step));
    } else {
      const double error = relative_error(*got.logged_loss, want.loss);
      v.logged_loss_rel_error = worst_of(v.logged_loss_rel_error, error);
      if (!(error <= tolerance.scalar_rel)) {
        fail("logged-loss", fmt::format("step {}: logged loss {:.9g}, oracle {:.9g}, rel error {:.3g} > {:.0e}",
                         step, *got.logged_loss, want.loss, error, tolerance.scalar_rel));
      }
    }

    if (s.clip_max_norm) {
      if (!got.grad_norm) {
        fail("grad-norm", fmt::format("step {}: clip_max_norm is {} but clip_grad_norm_ never ran", step,
                         *s.clip_max_norm));
      } else {
        const double error = relative_error(*got.grad_norm, want.total_norm);
        v.grad_norm_rel_error = worst_of(v.grad_norm_rel_error, error);
        if (!(error <= tolerance.scalar_rel)) {
          fail("grad-norm", fmt::format("step {}: grad norm {:.9g}, oracle {:.9g}, rel error {:.3g} > {:.0e}",
                           step, *got.grad_norm, want.total_norm, error, tolerance.scalar_rel));
        }
      }
    }
  }
}

}  // namespace

std::string outcome_of(const harness::Observation& o) {
  if (o.error) return fmt::format("raises {}", o.error->type);
  if (o.steps.empty()) return "no step";
  std::vector<std::string> bad;
  const harness::StepRecord& first = o.steps.front();
  bool missing = false;
  for (const auto& g : first.gradients) missing = missing || !g.value.defined();
  if (missing) bad.push_back("missing gradients");
  if (!finite_tensors(first.gradients)) bad.push_back("gradients");
  if (first.grad_norm && !std::isfinite(*first.grad_norm)) bad.push_back("grad norm");
  if (first.logged_loss && !std::isfinite(*first.logged_loss)) bad.push_back("logged loss");
  if (!finite_tensors(first.parameters_after)) bad.push_back("parameters");
  if (bad.empty()) return "finite";
  return fmt::format("non-finite {}", fmt::join(bad, ", "));
}

Verdict judge(const scenarios::Scenario& s, const harness::Observation& observed,
              const OracleResult& oracle, const harness::Observation& reference) {
  Verdict v;
  v.outcome = outcome_of(observed);
  const std::string expected = outcome_of(reference);
  if (oracle.no_gradient) {
    // The contract, for a reference as for any step: no finite update where no gradient
    // exists. A reference matches itself, so this is the check it meets (design §3).
    if (!observed.error && moved_finitely(observed)) {
      v.kind = VerdictKind::error_mismatch;
      add_check(v, "error-behaviour");
      v.reasons.push_back(fmt::format(
          "N == 0 but the parameters moved by a finite step ({}): a silent update where no "
          "gradient exists",
          v.outcome));
      return v;
    }
    if (v.outcome == "finite") {
      v.kind = VerdictKind::error_mismatch;
      add_check(v, "error-behaviour");
      v.reasons.push_back(fmt::format("N == 0 but the step returned finite gradients, loss and "
                                      "parameters: a silent update where no gradient exists"));
    } else if (v.outcome == expected) {
      v.kind = VerdictKind::expected_error;
    } else {
      v.kind = VerdictKind::error_mismatch;
      add_check(v, "error-behaviour");
      v.reasons.push_back(fmt::format("N == 0: {}, but its reference {} {}", v.outcome,
                                      reference.variant, expected));
    }
    return v;
  }
  if (observed.error) {
    const bool refused_like_reference = observed.error->type == "refusal" && reference.error &&
                                        reference.error->type == "refusal";
    v.kind = refused_like_reference ? VerdictKind::expected_error : VerdictKind::error_mismatch;
    if (!refused_like_reference) {
      add_check(v, "error-behaviour");
      v.reasons.push_back(fmt::format("raised {} ({}) where the oracle has a gradient",
                                      observed.error->type, observed.error->message));
    }
    return v;
  }
  judge_numbers(s, observed, oracle, v);
  return v;
}

namespace {

int severity(VerdictKind kind) {
  switch (kind) {
    case VerdictKind::pass: return 0;
    case VerdictKind::expected_error: return 1;
    case VerdictKind::fail: return 2;
    case VerdictKind::error_mismatch: return 3;
  }
  return 3;
}

void merge_optional_max(std::optional<double>& into, const std::optional<double>& value) {
  if (value) into = worst_of(into, *value);
}

}  // namespace

Verdict judge_ranks(const scenarios::Scenario& s, const harness::RankedRun& observed,
                    const OracleResult& oracle, const harness::RankedRun& reference) {
  Verdict v;
  const std::size_t world = static_cast<std::size_t>(s.world_size);
  auto aborted = [&](std::string why) {
    v.kind = VerdictKind::error_mismatch;
    v.outcome = "run aborted";
    add_check(v, "run");
    v.reasons.push_back(std::move(why));
    return v;
  };
  if (observed.fault) return aborted("run aborted: " + *observed.fault);
  if (reference.fault) return aborted("the reference run aborted: " + *reference.fault);
  if (observed.ranks.size() != world || reference.ranks.size() != world) {
    return aborted(fmt::format("expected {} ranks, observed {} and reference {}", world,
                               observed.ranks.size(), reference.ranks.size()));
  }
  std::vector<Verdict> per_rank;
  for (std::size_t r = 0; r < world; ++r) {
    // Replicas usually hold the same bits: an earlier rank with the same observation and
    // the same reference observation has this rank's verdict already (judge reads nothing
    // else of a rank).
    std::optional<std::size_t> same;
    for (std::size_t k = 0; k < r && !same; ++k) {
      if (same_observation(observed.ranks[r], observed.ranks[k]) &&
          same_observation(reference.ranks[r], reference.ranks[k])) {
        same = k;
      }
    }
    per_rank.push_back(same ? per_rank[*same] : judge(s, observed.ranks[r], oracle, reference.ranks[r]));
  }
  bool same_reasons = true, same_outcome = true;
  for (const Verdict& r : per_rank) {
    same_reasons = same_reasons && r.reasons == per_rank.front().reasons;
    same_outcome = same_outcome && r.outcome == per_rank.front().outcome;
  }
  for (std::size_t r = 0; r < world; ++r) {
    const Verdict& one = per_rank[r];
    if (severity(one.kind) > severity(v.kind)) v.kind = one.kind;
    v.gradients.merge(one.gradients);
    v.updates.merge(one.updates);
    merge_optional_max(v.logged_loss_rel_error, one.logged_loss_rel_error);
    merge_optional_max(v.grad_norm_rel_error, one.grad_norm_rel_error);
    if (r == 0) v.notes = one.notes;
    for (const std::string& check : one.failed_checks) add_check(v, check);
    if (!same_reasons || r == 0) {
      for (const std::string& reason : one.reasons) {
        v.reasons.push_back(world == 1 ? reason
                            : same_reasons ? "every rank: " + reason
                                           : fmt::format("rank {}: {}", r, reason));
      }
    }
  }
  v.outcome = per_rank.empty() ? "no rank" : per_rank.front().outcome;
  if (!same_outcome) {
    std::vector<std::string> parts;
    for (std::size_t r = 0; r < world; ++r) parts.push_back(fmt::format("rank {}: {}", r, per_rank[r].outcome));
    v.outcome = fmt::format("{}", fmt::join(parts, "; "));
  }
  // Ranks hold replicas: after the reduction every number must be the same on every rank.
  for (std::size_t r = 1; r < world; ++r) {
    if (same_observation(observed.ranks[r], observed.ranks[0])) continue;
    const PairComparison pair = compare_observations(observed.ranks[r], observed.ranks[0],
                                                     harness::scalar_type(s.dtype));
    if (pair.comparable && !pair.bitwise_equal) {
      if (severity(v.kind) < severity(VerdictKind::fail)) v.kind = VerdictKind::fail;
      add_check(v, "ranks-agree");
      v.reasons.push_back(fmt::format("ranks disagree: rank {} differs from rank 0 ({}, max {} ULP)",
                                      r, pair.first_difference, pair.max_ulp));
      break;
    }
  }
  return v;
}

std::string_view to_string(VerdictKind kind) {
  switch (kind) {
    case VerdictKind::pass: return "pass";
    case VerdictKind::fail: return "fail";
    case VerdictKind::expected_error: return "expected-error";
    case VerdictKind::error_mismatch: return "error-mismatch";
  }
  return "<unknown>";
}

}  // namespace gradnorm::oracles
