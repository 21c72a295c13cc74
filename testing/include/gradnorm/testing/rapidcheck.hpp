#pragma once
// rapidcheck helpers that fuzz a registered step over gradnorm's scenario generators
// (gradnorm/scenarios/generators.hpp). Inside a property:
//
//   RC_GTEST_PROP(MyStep, AgreesOnRaggedRanks, ()) {
//     gradnorm::testing::rc_assert_agrees_where_reference_does(
//         "my-step", *gradnorm::scenarios::ragged_rank_scenarios());
//   }
//
// A counter-example prints as a scenario, with the verdict and the per-token weights.

#include <rapidcheck.h>

#include <string>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/oracles/properties.hpp"
#include "gradnorm/scenarios/generators.hpp"

namespace gradnorm::testing {

// The step agrees with the oracle on `scenario` wherever its reference does (see
// oracles::properties::agrees_where_reference_does).
inline void rc_assert_agrees_where_reference_does(const std::string& variant,
                                                  const scenarios::Scenario& scenario) {
  harness::DeterminismGuard guard;
  oracles::properties::agrees_where_reference_does(variant, scenario);
}

// Runs the property above over single-device windows (accumulation, empty micro-batches,
// every dtype, loss and optimizer) and over ragged ranks. Returns whether both held; the
// number of cases and the seed come from RC_PARAMS, so a failure replays.
inline bool check_step(const std::string& variant) {
  bool held = rc::check(variant + " agrees where its reference does, on one device", [variant] {
    rc_assert_agrees_where_reference_does(variant, *scenarios::single_device_scenarios());
  });
  held = rc::check(variant + " agrees where its reference does, on ragged ranks", [variant] {
           rc_assert_agrees_where_reference_does(variant, *scenarios::ragged_rank_scenarios());
         }) && held;
  return held;
}

}  // namespace gradnorm::testing
