#pragma once
// Helpers for the tests of models from files (tests/harness/torchscript_model_test.cpp,
// tests/python/python_model_test.cpp).

#include <stdexcept>
#include <string>

#include "gradnorm/harness/model.hpp"
#include "gradnorm/harness/variant.hpp"
#include "gradnorm/oracles/evaluation.hpp"

namespace gradnorm::testing_support {

// The evaluation's row for `variant` (the evaluation holds one scenario).
inline const oracles::EvaluationRow& row_of(const oracles::Evaluation& e, const std::string& variant) {
  for (const oracles::EvaluationRow& row : e.rows) {
    if (row.variant.name == variant) return row;
  }
  throw std::runtime_error("no row for " + variant);
}

// The input error making the scenario's model raises, or "<accepted>".
inline std::string model_input_error(const scenarios::Scenario& s) {
  try {
    (void)harness::make_model(s, harness::model_config_for(harness::find_variant("baseline"), s));
  } catch (const scenarios::InvalidInput& error) {
    return error.what();
  }
  return "<accepted>";
}

}  // namespace gradnorm::testing_support
