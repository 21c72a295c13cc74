#pragma once
// Losses modelled on torchtune's. A loss serves both sides of a judgement without
// normalising anything for the oracle (docs/design.md §2): a step gets the token mean its
// loss module returns for one micro-batch, formed the way that module forms it (which
// decides what an all-masked micro-batch does); the oracle gets the loss of every valid
// token, unreduced, and forms the step's mean itself.

#include <ATen/core/Tensor.h>

#include <memory>

#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::harness {

class Loss {
 public:
  virtual ~Loss() = default;
  // logits [B, T, V] in the model's dtype, labels [B, T] with -100 where ignored; upcast to
  // at least float32 first, as torchtune's recipes do. A scalar.
  [[nodiscard]] virtual at::Tensor token_mean(const at::Tensor& logits,
                                              const at::Tensor& labels) const = 0;
  // rows [M, V]: the logits of M valid tokens; targets [M]. The M per-token losses, in the
  // rows' dtype, with no reduction.
  [[nodiscard]] virtual at::Tensor per_token(const at::Tensor& rows,
                                             const at::Tensor& targets) const = 0;
};

// The scenario's loss: mean_ce, chunked_ce (with loss_chunks) or linear_ce.
[[nodiscard]] std::unique_ptr<Loss> make_loss(const scenarios::Scenario& scenario);

}  // namespace gradnorm::harness
