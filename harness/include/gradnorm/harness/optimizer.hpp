#pragma once
// The optimizer a step trains with, built by the harness from the scenario (SGD, SGD with
// momentum or AdamW from torch::optim). It records every gradient at the moment it
// consumes it: a step cannot claim gradients it did not use (docs/design.md §4).

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "gradnorm/harness/observation.hpp"
#include "gradnorm/scenarios/scenario.hpp"

namespace torch::optim {
class Optimizer;
}

namespace gradnorm::harness {

class Model;

class Optimizer {
 public:
  // Over `model`'s trainable parameters, in model order. `counters` counts step() calls.
  Optimizer(const scenarios::Scenario& scenario, const Model& model, Counters& counters);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // optimizer.step(): consumes the .grad of every trainable parameter (a parameter with no
  // gradient is recorded as consuming none). After use_per_parameter_optimizers() it is a
  // no-op, as torchtune's OptimizerInBackward.step() is; it is still counted.
  void step();
  // optimizer.zero_grad(set_to_none): drops (or zeroes) every trainable parameter's .grad.
  void zero_grad(bool set_to_none = true);

  // Optimizer in backward (torchtune's optim_dict): one optimizer per parameter, stepped
  // from that parameter's gradient hook with step_parameter(i), which consumes .grad of
  // trainable parameter i.
  void use_per_parameter_optimizers();
  void step_parameter(std::size_t index);
  [[nodiscard]] bool per_parameter() const { return per_parameter_; }

  // The trainable parameters it updates, in model order.
  [[nodiscard]] const std::vector<at::Tensor>& parameters() const { return parameters_; }

  // Harness side: forget what was consumed (at the start of every optimizer step), and
  // read it back (one entry per trainable parameter; undefined where none was consumed).
  void begin_recording();
  [[nodiscard]] std::vector<NamedTensor> consumed() const;

 private:
  void record(std::size_t index);

  const scenarios::Scenario& scenario_;
  Counters& counters_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> parameters_;
  std::vector<at::Tensor> consumed_;
  std::unique_ptr<torch::optim::Optimizer> whole_;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> per_parameter_optimizers_;
  bool per_parameter_ = false;
};

}  // namespace gradnorm::harness
