#pragma once
// A scenario's dtype as LibTorch's scalar type: one mapping, for every side that needs it.
// The harness builds batches, models and optimizer state in it (batch.cpp, model.cpp); the
// oracle's comparator counts ULPs in it and the verdict and evaluation name it
// (oracles/src/verdict.cpp, evaluation.cpp). Small and inline, so the oracle side does not
// reach into the batch generator for it.
#include <c10/core/ScalarType.h>

#include <stdexcept>

#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::harness {

[[nodiscard]] constexpr c10::ScalarType scalar_type(scenarios::DType dtype) {
  switch (dtype) {
    case scenarios::DType::float64: return c10::ScalarType::Double;
    case scenarios::DType::float32: return c10::ScalarType::Float;
    case scenarios::DType::bfloat16: return c10::ScalarType::BFloat16;
  }
  throw std::logic_error("harness bug: unhandled dtype");
}

}  // namespace gradnorm::harness
