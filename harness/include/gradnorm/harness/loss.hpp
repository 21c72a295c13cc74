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

// What a recipe optimises per token.
enum class Objective {
  scenario_loss,           // the scenario's loss (cross-entropy in one of three forms)
  knowledge_distillation,  // (1 - kd_ratio) * cross-entropy + kd_ratio * forward KL
};

// The valid tokens of a step, row by row.
struct TokenRows {
  at::Tensor logits;          // [M, V]: the trained model's logits at the M valid positions
  at::Tensor targets;         // [M]
  at::Tensor teacher_logits;  // [M, V]: a frozen teacher's, for distillation; else undefined
};

// The oracle's side: the loss of every valid token, in the rows' dtype, with no reduction.
class PerTokenLoss {
 public:
  virtual ~PerTokenLoss() = default;
  [[nodiscard]] virtual at::Tensor per_token(const TokenRows& rows) const = 0;
};

// A step's side too: the token mean its module returns for one micro-batch.
class Loss : public PerTokenLoss {
 public:
  // logits [B, T, V] in the model's dtype, labels [B, T] with -100 where ignored; upcast to
  // at least float32 first, as torchtune's recipes do. A scalar.
  [[nodiscard]] virtual at::Tensor token_mean(const at::Tensor& logits,
                                              const at::Tensor& labels) const = 0;
};

// The scenario's loss: mean_ce, chunked_ce (with loss_chunks) or linear_ce.
[[nodiscard]] std::unique_ptr<Loss> make_loss(const scenarios::Scenario& scenario);

// torchtune's knowledge-distillation loss as a distilling recipe instantiates it:
// ForwardKLLoss, or ForwardKLWithChunkedOutputLoss when the scenario's loss is chunked
// (the recipes require both to chunk alike).
class DistillationLoss {
 public:
  virtual ~DistillationLoss() = default;
  // student and teacher logits [B, T, V], labels [B, T]. A scalar (float32, as torchtune
  // computes it): minus the teacher-weighted student log-probabilities, averaged over the
  // valid tokens.
  [[nodiscard]] virtual at::Tensor operator()(const at::Tensor& student_logits,
                                              const at::Tensor& teacher_logits,
                                              const at::Tensor& labels) const = 0;
};
[[nodiscard]] std::unique_ptr<DistillationLoss> make_distillation_loss(
    const scenarios::Scenario& scenario);

// The per-token objective the oracle averages over the step: the scenario's loss, or for
// distillation (1 - kd_ratio) * CE_i + kd_ratio * (-sum_v p_teacher(v) log p_student(v)).
[[nodiscard]] std::unique_ptr<PerTokenLoss> make_objective(const scenarios::Scenario& scenario,
                                                           Objective objective);

}  // namespace gradnorm::harness
