#pragma once
// Error metrics between two sets of named tensors, and between two observations.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gradnorm/harness/observation.hpp"

namespace gradnorm::oracles {

struct ErrorMetrics {
  double max_abs_error = 0;
  double rel_l2_error = 0;     // ||actual - expected|| / ||expected|| (0/0 counts as 0)
  std::int64_t max_ulp = 0;    // in the compared dtype, after rounding `expected` to it
  double cosine = 1;           // of the flattened sets; 1 when both are zero
  bool all_finite = true;      // every actual element is finite
  bool complete = true;        // every expected tensor has a defined actual counterpart
  std::string worst;           // "head.weight[3]: got 0.1, want 0.2" (largest abs error)
  // Folds another comparison in: the worst of each metric.
  void merge(const ErrorMetrics& other);
};

// ULP distance of two values once both are rounded to `dtype` (float64, float32 or bfloat16);
// saturates at INT64_MAX. NaN against anything is INT64_MAX.
[[nodiscard]] std::int64_t ulp_distance(double a, double b, c10::ScalarType dtype);

// Compares tensors name by name; `expected` may be in another (wider) dtype than `actual`.
[[nodiscard]] ErrorMetrics compare_tensors(const std::vector<harness::NamedTensor>& actual,
                                           const std::vector<harness::NamedTensor>& expected,
                                           c10::ScalarType ulp_dtype);

// Parameter updates of a step: after - before, name by name.
[[nodiscard]] std::vector<harness::NamedTensor> updates(
    const std::vector<harness::NamedTensor>& before,
    const std::vector<harness::NamedTensor>& after);

// Every element finite: one pass over the data for float64, float32 and bfloat16 (no tensor
// operations; this runs for every rank of every row).
[[nodiscard]] bool all_finite(const at::Tensor& tensor);

// True when the two observations hold the same bits in every number a user sees (initial
// parameters, gradients, parameters after, norms, logged losses) and the same error: a
// memcmp, no arithmetic, so NaNs compare by their bits.
[[nodiscard]] bool same_observation(const harness::Observation& a, const harness::Observation& b);

// How close two variants' observations are: bitwise on every number a user sees.
struct PairComparison {
  bool comparable = true;      // same number of steps, neither raised
  bool bitwise_equal = false;  // gradients, grad norm, logged loss and parameters, every step
  std::int64_t max_ulp = 0;    // over gradients and parameters
  double max_abs_error = 0;
  double gradient_rel_l2 = 0;
  std::string first_difference;  // empty when bitwise equal
};

[[nodiscard]] PairComparison compare_observations(const harness::Observation& a,
                                                  const harness::Observation& b,
                                                  c10::ScalarType dtype);

}  // namespace gradnorm::oracles
