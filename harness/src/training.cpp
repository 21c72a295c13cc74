#include "gradnorm/harness/training.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "gradnorm/harness/step.hpp"

namespace gradnorm::harness::training {

at::Tensor valid_token_count(const MicroBatch& batch) { return batch.labels.ne(kIgnoreIndex).sum(); }

void backward(StepContext& context, const at::Tensor& loss) {
  ++context.counters().backward_calls;
  loss.backward();
}

void scale_grads(StepContext& context, const at::Tensor& scaler) {
  at::NoGradGuard no_grad;
  for (const at::Tensor& p : context.optimizer().parameters()) {
    if (p.grad().defined()) p.mutable_grad().mul_(scaler);
  }
  ++context.counters().scale_passes;
}

namespace {

// FSDP's (and HSDP's) gradient group: every rank with this rank's tensor-parallel
// coordinate, dp_replicate x dp_shard x cp of them.
std::vector<int> fsdp_group(const scenarios::Scenario& s, int rank) {
  std::vector<int> ranks;
  for (int r = rank % s.tp; r < s.world_size; r += s.tp) ranks.push_back(r);
  return ranks;
}

// Sums `grads` over the FSDP group and divides by its size, before or after the sum.
void average_in_fsdp_group(StepContext& context, std::vector<at::Tensor>& grads) {
  const scenarios::Scenario& s = context.scenario();
  Communicator& group = context.comm().group(fsdp_group(s, context.rank()));
  const int size = group.world_size();
  const bool before = s.rank_average == scenarios::RankAverage::divide_before_sum;
  if (before) {
    for (at::Tensor& g : grads) g.div_(size);
  }
  group.all_reduce_sum(grads);
  if (!before) {
    for (at::Tensor& g : grads) g.div_(size);
  }
}

}  // namespace

void rank_average(StepContext& context) {
  if (context.world_size() == 1) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (at::Tensor p : context.optimizer().parameters()) {
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    grads.push_back(p.grad());
  }
  average_in_fsdp_group(context, grads);
  ++context.counters().reduce_passes;
}

double clip_grad_norm(StepContext& context, double max_norm) {
  ++context.counters().clip_calls;
  // The arithmetic of Python's torch.nn.utils.clip_grad_norm_ (torch 1.13), which recipes
  // call: LibTorch's C++ clip_grad_norm_ forms max_norm / (norm + 1e-6) as a division in the
  // gradients' dtype, Python as number_over (a reciprocal and a product), and in bfloat16
  // the two differ.
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : context.optimizer().parameters()) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) {
    context.report_grad_norm(0.0);
    return 0.0;
  }
  std::vector<at::Tensor> norms;
  norms.reserve(grads.size());
  for (const at::Tensor& g : grads) norms.push_back(g.norm(2));
  const at::Tensor total_norm = at::stack(norms).norm(2);
  const at::Tensor clip_coef = number_over(max_norm, total_norm + 1e-6);
  const at::Tensor clip_coef_clamped = at::clamp(clip_coef, c10::nullopt, 1.0);
  for (at::Tensor& g : grads) g.mul_(clip_coef_clamped);
  const double norm = total_norm.item<double>();
  context.report_grad_norm(norm);
  return norm;
}

at::Tensor number_over(double number, const at::Tensor& tensor) {
  return tensor.reciprocal() * number;
}

double loss_to_log(const at::Tensor& running_loss, const at::Tensor& num_tokens) {
  return number_over(running_loss.item<double>(), num_tokens).item<double>();
}

void register_optim_in_bwd_hooks(StepContext& context) {
  Optimizer& optimizer = context.optimizer();
  optimizer.use_per_parameter_optimizers();
  for (std::size_t i = 0; i < optimizer.parameters().size(); ++i) {
    at::Tensor param = optimizer.parameters()[i];
    // The hook reaches its parameter through the optimizer: a tensor holding a hook that
    // holds the tensor would never be freed.
    param.register_hook([&context, &optimizer, i](const at::Tensor& grad) {
      at::Tensor own = optimizer.parameters()[i];
      at::Tensor averaged = grad.detach().clone();
      const int world = context.world_size();
      if (world > 1) {
        // FSDP's reduce-scatter averages the gradient before the post-accumulate hook.
        at::NoGradGuard no_grad;
        std::vector<at::Tensor> one{averaged};
        average_in_fsdp_group(context, one);
      }
      own.mutable_grad() = averaged;
      optimizer.step_parameter(i);
      own.mutable_grad() = at::Tensor();
      // LibTorch 1.13 has no post-accumulate hook: AccumulateGrad then stores these zeros,
      // which the recipe's zero_grad(set_to_none=True) clears after backward.
      return at::zeros_like(grad);
    });
  }
}

}  // namespace gradnorm::harness::training
