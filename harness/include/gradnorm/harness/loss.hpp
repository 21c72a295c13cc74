#pragma once
// Loss functions modelled on torchtune's. Each returns the token-mean cross-entropy of one
// micro-batch as a float32 (or wider) scalar; they differ only in how the mean is formed,
// which is what decides the behaviour of an all-masked batch.

#include <ATen/core/Tensor.h>

#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::harness {

struct LossOptions {
  scenarios::LossKind kind = scenarios::LossKind::mean_ce;
  int chunks = 2;  // chunked_ce: pieces along the sequence (torchtune's num_output_chunks)
};

// logits [B, T, V] in the model's dtype, labels [B, T] with -100 for ignored positions.
// Logits are upcast to at least float32 first, as torchtune's recipes do.
[[nodiscard]] at::Tensor recipe_loss(const at::Tensor& logits, const at::Tensor& labels,
                                     const LossOptions& options);

}  // namespace gradnorm::harness
