#include "gradnorm/harness/optimizer.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "gradnorm/harness/model.hpp"

namespace gradnorm::harness {
namespace {

using scenarios::OptimizerKind;

std::unique_ptr<torch::optim::Optimizer> make_torch_optimizer(const scenarios::Scenario& s,
                                                              std::vector<at::Tensor> params) {
  switch (s.optimizer) {
    case OptimizerKind::sgd:
      return std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(s.learning_rate).weight_decay(s.weight_decay));
    case OptimizerKind::sgd_momentum:
      return std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(s.learning_rate)
                      .momentum(s.momentum)
                      .weight_decay(s.weight_decay));
    case OptimizerKind::adamw:
      return std::make_unique<torch::optim::AdamW>(
          params, torch::optim::AdamWOptions(s.learning_rate).weight_decay(s.weight_decay));
  }
  TORCH_INTERNAL_ASSERT(false, "harness bug: unhandled optimizer");
}

}  // namespace

Optimizer::Optimizer(const scenarios::Scenario& scenario, const Model& model, Counters& counters)
    : scenario_(scenario), counters_(counters) {
  for (const Parameter& p : model.parameters()) {
    if (!p.trainable) continue;
    names_.push_back(p.name);
    parameters_.push_back(p.value);
  }
  consumed_.resize(parameters_.size());
}

Optimizer::~Optimizer() = default;

void Optimizer::record(std::size_t index) {
  const at::Tensor& grad = parameters_[index].grad();
  consumed_[index] = grad.defined() ? grad.detach().clone() : at::Tensor();
}

void Optimizer::step() {
  ++counters_.optimizer_steps;
  if (per_parameter_) return;  // the hooks stepped every parameter during backward
  for (std::size_t i = 0; i < parameters_.size(); ++i) record(i);
  if (!whole_) whole_ = make_torch_optimizer(scenario_, parameters_);
  whole_->step();
}

void Optimizer::zero_grad(bool set_to_none) {
  at::NoGradGuard no_grad;
  for (at::Tensor& p : parameters_) {
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      p.mutable_grad() = at::Tensor();
    } else {
      p.mutable_grad().zero_();
    }
  }
}

void Optimizer::use_per_parameter_optimizers() {
  if (per_parameter_) return;
  per_parameter_ = true;
  for (const at::Tensor& p : parameters_) {
    per_parameter_optimizers_.push_back(make_torch_optimizer(scenario_, {p}));
  }
}

void Optimizer::step_parameter(std::size_t index) {
  TORCH_CHECK(per_parameter_, "step_parameter needs use_per_parameter_optimizers() first");
  TORCH_CHECK(index < parameters_.size(), "step_parameter(", index, "): the model has ",
              parameters_.size(), " trainable parameters");
  record(index);
  per_parameter_optimizers_[index]->step();
}

void Optimizer::begin_recording() {
  consumed_.assign(parameters_.size(), at::Tensor());
}

std::vector<NamedTensor> Optimizer::consumed() const {
  std::vector<NamedTensor> out;
  for (std::size_t i = 0; i < parameters_.size(); ++i) out.push_back({names_[i], consumed_[i]});
  return out;
}

}  // namespace gradnorm::harness
