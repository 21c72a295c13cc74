#include "gradnorm/oracles/comparator.hpp"

#include <ATen/ATen.h>

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace gradnorm::oracles {
namespace {

constexpr std::int64_t kMaxUlp = std::numeric_limits<std::int64_t>::max();

// Sign-magnitude bits to a monotonic integer line: adjacent floats differ by 1.
std::int64_t ordinal(double value, c10::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble: {
      const auto bits = std::bit_cast<std::int64_t>(value);
      return bits < 0 ? -(bits & std::numeric_limits<std::int64_t>::max()) : bits;
    }
    case at::kFloat: {
      const auto bits = std::bit_cast<std::int32_t>(static_cast<float>(value));
      return bits < 0 ? -static_cast<std::int64_t>(bits & 0x7fffffff) : bits;
    }
    case at::kBFloat16: {
      const c10::BFloat16 rounded(static_cast<float>(value));
      const auto bits = static_cast<std::int16_t>(rounded.x);
      return bits < 0 ? -static_cast<std::int64_t>(bits & 0x7fff) : bits;
    }
    default: break;
  }
  TORCH_INTERNAL_ASSERT(false, "harness bug: ULP distance asked for dtype ", dtype);
}

}  // namespace

std::int64_t ulp_distance(double a, double b, c10::ScalarType dtype) {
  if (std::isnan(a) || std::isnan(b)) return kMaxUlp;
  const std::int64_t x = ordinal(a, dtype);
  const std::int64_t y = ordinal(b, dtype);
  // Both ordinals fit in 63 bits of magnitude; the difference can overflow only for
  // float64 values of opposite sign and huge magnitude.
  if ((x < 0) != (y < 0) && std::abs(static_cast<double>(x) - static_cast<double>(y)) > 9e18) {
    return kMaxUlp;
  }
  return x > y ? x - y : y - x;
}

void ErrorMetrics::merge(const ErrorMetrics& other) {
  if (other.max_abs_error > max_abs_error || std::isnan(other.max_abs_error)) {
    max_abs_error = other.max_abs_error;
    worst = other.worst;
  }
  if (other.rel_l2_error > rel_l2_error || std::isnan(other.rel_l2_error)) {
    rel_l2_error = other.rel_l2_error;
  }
  max_ulp = std::max(max_ulp, other.max_ulp);
  if (other.cosine < cosine || std::isnan(other.cosine)) cosine = other.cosine;
  all_finite = all_finite && other.all_finite;
  complete = complete && other.complete;
}

ErrorMetrics compare_tensors(const std::vector<harness::NamedTensor>& actual,
                             const std::vector<harness::NamedTensor>& expected,
                             c10::ScalarType ulp_dtype) {
  ErrorMetrics m;
  double diff_sq = 0, expected_sq = 0, actual_sq = 0, dot = 0;
  TORCH_INTERNAL_ASSERT(actual.size() == expected.size(), "harness bug: compared ",
                        actual.size(), " tensors against ", expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    TORCH_INTERNAL_ASSERT(actual[i].name == expected[i].name, "harness bug: parameter order ",
                          actual[i].name, " vs ", expected[i].name);
    const at::Tensor want = expected[i].value.detach().to(at::kDouble).contiguous().reshape({-1});
    if (!actual[i].value.defined()) {
      m.complete = false;
      expected_sq += want.pow(2).sum().item<double>();
      diff_sq += want.pow(2).sum().item<double>();
      const double biggest = want.numel() ? want.abs().max().item<double>() : 0.0;
      if (m.worst.empty() || biggest > m.max_abs_error) {
        m.max_abs_error = biggest;
        m.worst = fmt::format("{}: missing (nothing consumed)", actual[i].name);
      }
      m.max_ulp = kMaxUlp;
      continue;
    }
    const at::Tensor got = actual[i].value.detach().to(at::kDouble).contiguous().reshape({-1});
    const double* g = got.data_ptr<double>();
    const double* w = want.data_ptr<double>();
    long worst_here = -1;  // formatted once, after the loop
    for (long k = 0; k < got.numel(); ++k) {
      const double err = std::abs(g[k] - w[k]);
      if (!std::isfinite(g[k])) m.all_finite = false;
      const bool first_nan = std::isnan(err) && !std::isnan(m.max_abs_error);
      if ((m.worst.empty() && worst_here < 0) || err > m.max_abs_error || first_nan) {
        m.max_abs_error = err;
        worst_here = k;
      }
      m.max_ulp = std::max(m.max_ulp, ulp_distance(g[k], w[k], ulp_dtype));
      diff_sq += (g[k] - w[k]) * (g[k] - w[k]);
      expected_sq += w[k] * w[k];
      actual_sq += g[k] * g[k];
      dot += g[k] * w[k];
    }
    if (worst_here >= 0) {
      m.worst = fmt::format("{}[{}]: got {:.9g}, want {:.9g}", actual[i].name, worst_here,
                            g[worst_here], w[worst_here]);
    }
  }
  if (diff_sq == 0) {
    m.rel_l2_error = 0;
  } else if (expected_sq == 0) {
    m.rel_l2_error = std::numeric_limits<double>::infinity();
  } else {
    m.rel_l2_error = std::sqrt(diff_sq / expected_sq);
  }
  if (actual_sq == 0 && expected_sq == 0) {
    m.cosine = 1;
  } else if (actual_sq == 0 || expected_sq == 0) {
    m.cosine = 0;
  } else {
    m.cosine = dot / std::sqrt(actual_sq * expected_sq);
  }
  if (!m.all_finite) m.rel_l2_error = std::numeric_limits<double>::quiet_NaN();
  return m;
}

std::vector<harness::NamedTensor> updates(const std::vector<harness::NamedTensor>& before,
                                          const std::vector<harness::NamedTensor>& after) {
  std::vector<harness::NamedTensor> out;
  for (std::size_t i = 0; i < after.size(); ++i) {
    out.push_back({after[i].name, after[i].value.to(at::kDouble) - before.at(i).value.to(at::kDouble)});
  }
  return out;
}

namespace {

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.scalar_type() != b.scalar_type() || !a.sizes().equals(b.sizes())) return false;
  const at::Tensor x = a.contiguous();
  const at::Tensor y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

bool same_bits(const std::optional<double>& a, const std::optional<double>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || std::bit_cast<std::uint64_t>(*a) == std::bit_cast<std::uint64_t>(*b);
}

}  // namespace

namespace {

template <typename T>
bool finite_data(const at::Tensor& contiguous) {
  const T* data = contiguous.data_ptr<T>();
  for (long k = 0; k < contiguous.numel(); ++k) {
    if (!std::isfinite(static_cast<double>(data[k]))) return false;
  }
  return true;
}

}  // namespace

bool all_finite(const at::Tensor& tensor) {
  const at::Tensor c = tensor.detach().contiguous();
  switch (c.scalar_type()) {
    case at::kDouble: return finite_data<double>(c);
    case at::kFloat: return finite_data<float>(c);
    case at::kBFloat16: return finite_data<c10::BFloat16>(c);
    default: return at::isfinite(c).all().item<bool>();
  }
}

namespace {

bool same_tensors(const std::vector<harness::NamedTensor>& a, const std::vector<harness::NamedTensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || !same_bits(a[i].value, b[i].value)) return false;
  }
  return true;
}

// Every tensor defined and finite.
bool defined_and_finite(const std::vector<harness::NamedTensor>& tensors) {
  for (const harness::NamedTensor& t : tensors) {
    if (!t.value.defined() || !all_finite(t.value)) return false;
  }
  return true;
}

}  // namespace

bool same_observation(const harness::Observation& a, const harness::Observation& b) {
  if (a.error.has_value() != b.error.has_value()) return false;
  if (a.error && (a.error->type != b.error->type || a.error->message != b.error->message)) return false;
  if (a.steps.size() != b.steps.size() || !same_tensors(a.initial_parameters, b.initial_parameters)) {
    return false;
  }
  for (std::size_t s = 0; s < a.steps.size(); ++s) {
    const harness::StepRecord& x = a.steps[s];
    const harness::StepRecord& y = b.steps[s];
    if (!same_tensors(x.gradients, y.gradients) || !same_tensors(x.parameters_after, y.parameters_after) ||
        !same_bits(x.grad_norm, y.grad_norm) || !same_bits(x.logged_loss, y.logged_loss)) {
      return false;
    }
  }
  return true;
}

PairComparison compare_observations(const harness::Observation& a, const harness::Observation& b,
                                    c10::ScalarType dtype) {
  PairComparison out;
  // Identical and finite: what the full comparison below would find, without its passes.
  bool fast = !a.error && !b.error && same_observation(a, b);
  for (const harness::StepRecord& step : a.steps) {
    fast = fast && defined_and_finite(step.gradients) && defined_and_finite(step.parameters_after);
  }
  if (fast) {
    out.bitwise_equal = true;
    return out;
  }
  if (a.error || b.error || a.steps.size() != b.steps.size()) {
    out.comparable = false;
    out.bitwise_equal = a.error && b.error && a.error->type == b.error->type &&
                        a.error->message == b.error->message && a.steps.size() == b.steps.size();
    if (!out.bitwise_equal) out.first_difference = "one raised or stopped early";
    return out;
  }
  out.bitwise_equal = true;
  ErrorMetrics gradients;
  for (std::size_t s = 0; s < a.steps.size(); ++s) {
    const harness::StepRecord& x = a.steps[s];
    const harness::StepRecord& y = b.steps[s];
    auto note = [&](std::string what) {
      if (out.bitwise_equal) out.first_difference = fmt::format("step {}: {}", s, what);
      out.bitwise_equal = false;
    };
    for (std::size_t i = 0; i < x.gradients.size(); ++i) {
      if (!same_bits(x.gradients[i].value, y.gradients.at(i).value)) note(x.gradients[i].name + " gradient");
    }
    for (std::size_t i = 0; i < x.parameters_after.size(); ++i) {
      if (!same_bits(x.parameters_after[i].value, y.parameters_after.at(i).value)) {
        note(x.parameters_after[i].name + " after the step");
      }
    }
    if (!same_bits(x.grad_norm, y.grad_norm)) note("grad norm");
    if (!same_bits(x.logged_loss, y.logged_loss)) note("logged loss");
    std::vector<harness::NamedTensor> ya = y.gradients;
    bool defined = true;
    for (std::size_t i = 0; i < x.gradients.size(); ++i) {
      defined = defined && x.gradients[i].value.defined() && ya[i].value.defined();
    }
    if (defined) gradients.merge(compare_tensors(x.gradients, y.gradients, dtype));
    const ErrorMetrics params = compare_tensors(x.parameters_after, y.parameters_after, dtype);
    out.max_ulp = std::max({out.max_ulp, gradients.max_ulp, params.max_ulp});
    out.max_abs_error = std::max({out.max_abs_error, gradients.max_abs_error, params.max_abs_error});
  }
  out.gradient_rel_l2 = gradients.rel_l2_error;
  return out;
}

}  // namespace gradnorm::oracles
