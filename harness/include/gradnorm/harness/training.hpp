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

// `running_loss.item() / num_tokens` in a recipe: a Python float divided by an int64 tensor
// is a float32 division, whatever the training dtype.
[[nodiscard]] double loss_to_log(const at::Tensor& running_loss, const at::Tensor& num_tokens);

// torchtune training.register_optim_in_bwd_hooks: one optimizer per parameter, stepped and
// cleared from that parameter's gradient hook as soon as its gradient is ready (averaged
// over ranks first, as FSDP's reduce-scatter is); from then on optimizer.step() is a no-op.
// Call from Step::prepare.
void register_optim_in_bwd_hooks(StepContext& context);

}  // namespace gradnorm::harness::training
