#pragma once
// Runs one scenario x variant on real LibTorch autograd and returns what a user would see.

#include "gradnorm/harness/batch.hpp"
#include "gradnorm/harness/observation.hpp"
#include "gradnorm/harness/variant.hpp"

namespace gradnorm::harness {

// Trains `scenario.steps` optimizer steps with the variant's arithmetic on one device.
// Errors raised by the step (a refusal, a LibTorch error) are recorded in the Observation,
// never thrown. Throws scenarios::InvalidInput when the scenario itself is invalid or has
// more than one rank (ranks are not supported by this runner).
[[nodiscard]] Observation run_single_device(const VariantSpec& variant,
                                            const scenarios::Scenario& scenario);

// The same with micro-batches from `batches` instead of the scenario's generator; each must
// hold the valid count the scenario asks for (checked: InvalidInput otherwise).
[[nodiscard]] Observation run_single_device(const VariantSpec& variant,
                                            const scenarios::Scenario& scenario,
                                            const BatchSource& batches);

// The first line of an exception's text, without LibTorch's "Exception raised from" trailer.
[[nodiscard]] std::string first_line(const std::string& text);

}  // namespace gradnorm::harness
