#pragma once
// One tolerance policy, keyed by the dtype a scenario trains in. Every bound carries the
// reason it is that wide.

#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::oracles {

struct Tolerance {
  double tensor_rel_l2;  // gradients and parameter updates against the float64 oracle
  double scalar_rel;     // logged loss and clipped norm against the oracle
  const char* reason;
};

[[nodiscard]] const Tolerance& tolerance_for(scenarios::DType dtype);

// One unit in the last place of `value` stored in `dtype`.
[[nodiscard]] double ulp_of(double value, scenarios::DType dtype);

}  // namespace gradnorm::oracles
