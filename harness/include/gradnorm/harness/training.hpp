#pragma once
// Small pieces that torchtune's recipes share, named after torchtune's own helpers, for
// steps to call (docs/design.md §4). None of them decides a normalisation: a scale factor
// is always the caller's, computed in the step as its recipe computes it.

#include <ATen/core/Tensor.h>

#include <vector>

#include "gradnorm/harness/batch.hpp"
#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::harness {
class StepContext;
}

namespace gradnorm::harness::training {

// (labels != ignore_index).sum(): an int64 scalar tensor.
[[nodiscard]] at::Tensor valid_token_count(const MicroBatch& batch);

// loss.backward(), counted in Counters::backward_calls.
void backward(StepContext& context, const at::Tensor& loss);

// torchtune training.scale_grads(model, scaler): p.grad *= scaler for every trainable
// parameter that has a gradient. One full pass over the gradients (Counters::scale_passes).
void scale_grads(StepContext& context, const at::Tensor& scaler);

// What FSDP/DDP do to gradients in backward on more than one rank: SUM over the ranks that
// share this rank's tensor-parallel coordinate (all of them without a mesh) and divide by
// their number, before or after the sum as the scenario's rank_average says.
// A parameter with no gradient takes part as zeros. Nothing on one rank.
void rank_average(StepContext& context);

// torch.nn.utils.clip_grad_norm_(params, max_norm) over the trainable parameters; the norm
// it returns is reported to the harness and returned.
double clip_grad_norm(StepContext& context, double max_norm);

// A recipe's `number / tensor` (`world_size / num_tokens`, `1 / num_tokens`): Python's
// Tensor.__rtruediv__ computes it as tensor.reciprocal() * number, a float32 tensor for an
// int64 count, which is not always the division's float32 (3 / 7 differs by one ulp).
[[nodiscard]] at::Tensor number_over(double number, const at::Tensor& tensor);

// `running_loss.item() / num_tokens` in a recipe: number_over(running_loss, num_tokens),
// float32 whatever the training dtype.
[[nodiscard]] double loss_to_log(const at::Tensor& running_loss, const at::Tensor& num_tokens);

// torchtune training.register_optim_in_bwd_hooks: one optimizer per parameter, stepped and
// cleared from that parameter's gradient hook as soon as its gradient is ready (averaged
// over ranks first, as FSDP's reduce-scatter is); from then on optimizer.step() is a no-op.
// Call from Step::prepare.
void register_optim_in_bwd_hooks(StepContext& context);

}  // namespace gradnorm::harness::training
