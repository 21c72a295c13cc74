#pragma once
// A model from a TorchScript file (scenario model = "torchscript:PATH").

#include <memory>

#include "gradnorm/harness/model.hpp"

namespace gradnorm::harness {

// Loads the scenario's model_file, converts its parameters to the scenario's dtype and
// checks that it maps token ids [B, T] to logits [B, T, vocab_size] with floating, partly
// trainable parameters. Throws scenarios::InvalidInput naming the file otherwise.
[[nodiscard]] std::unique_ptr<Model> load_torchscript_model(const scenarios::Scenario& scenario);

}  // namespace gradnorm::harness
