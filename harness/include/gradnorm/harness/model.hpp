#pragma once
// Models: the built-in zoo (small models whose parameters, gradients and forward pass live
// in the scenario's dtype), TorchScript modules from files and torch.nn.Modules built by a
// function in a Python file (gradnorm::python provides those). The recipe under test decides
// which changes it makes to the scenario's model (model_config_for).

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gradnorm/harness/batch.hpp"
#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::harness {

struct ModelConfig {
  // causal_lm, linear_head, token_probe, torchscript or python; scenarios::ModelKind::lora
  // is causal_lm with adapters.
  scenarios::ModelKind base = scenarios::ModelKind::causal_lm;
  // LoRA: base weights frozen, trainable low-rank adapters on every linear.
  bool lora = false;
  // QAT: the hidden and head weights are fake-quantised to int4 in the forward pass, with a
  // straight-through gradient.
  bool fake_quantize = false;
  // A frozen teacher for distillation: the same kind of model, drawn from its own seed
  // stream, nothing trainable (the token probe's teacher is a random table, not zeros).
  bool teacher = false;
  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

struct Parameter {
  std::string name;
  at::Tensor value;  // a leaf; requires_grad == trainable
  bool trainable = true;
};

// A model a step trains: named parameters in the scenario's dtype and a forward pass. The
// oracle runs a float64 copy of the very parameters a step starts from (docs/design.md §2).
class Model {
 public:
  virtual ~Model() = default;

  // Every parameter in a fixed order; trainable ones require grad.
  [[nodiscard]] virtual const std::vector<Parameter>& parameters() const = 0;
  [[nodiscard]] std::vector<at::Tensor> trainable_tensors() const;

  // Logits [B, T, V] in the parameters' dtype. Causal: position t sees inputs 0..t only.
  [[nodiscard]] virtual at::Tensor logits(const MicroBatch& batch) const = 0;

  // The logits at some positions only, [rows, V]: `rows` indexes the batch's B * T positions
  // flattened (int64, ascending). Only positions with a label carry a loss, so this is what
  // the oracle asks for. By default logits() of the whole batch, then those rows; the
  // built-in models compute their per-position layers at those rows alone (the same values).
  [[nodiscard]] virtual at::Tensor logits_at(const MicroBatch& batch, const at::Tensor& rows) const;

  // A detached copy with every parameter converted to `dtype` (the oracle's float64 twin).
  [[nodiscard]] virtual std::unique_ptr<Model> converted(c10::ScalarType dtype) const = 0;

  // The model's own state besides its parameters (a module's buffers), by name; the
  // built-in models keep none.
  [[nodiscard]] virtual std::vector<std::pair<std::string, at::Tensor>> buffers() const { return {}; }
};

// The scenario's model with the recipe's changes (`config`): one of the built-in models,
// with parameters drawn from the scenario's seed in float64 and rounded once to its dtype;
// the scenario's TorchScript file, loaded and converted to its dtype; or the module its
// Python file's function builds (through the loader set below), converted to its dtype.
// Throws scenarios::InvalidInput naming the file for a model it cannot train.
[[nodiscard]] std::unique_ptr<Model> make_model(const scenarios::Scenario& scenario,
                                                ModelConfig config);

// What the oracle assumes of a model from a file, checked on the float64 twin of `model`
// with the scenario's first micro-batch: its forward is a function of the token ids (two
// forwards give the same logits bit for bit: no dropout in training mode, no random draw),
// it changes none of its own buffers, its logits are finite, and it can be differentiated
// (no in-place update of a tensor its backward needs). Throws scenarios::InvalidInput naming
// the scenario and the model's file otherwise. Built-in models pass by construction.
void check_model_is_a_function(const scenarios::Scenario& scenario, const Model& model);

// "torchscript:FILE" or "python:FILE:FUNCTION": how messages name a scenario's model.
[[nodiscard]] std::string model_source(const scenarios::Scenario& scenario);

// Builds a model = "python:FILE.py:FUNCTION" scenario's model. The harness has no Python of
// its own: gradnorm::python sets this (python::install_python_models); until then such a
// scenario is an input error. Called from any thread; must be safe to call concurrently.
using PythonModelLoader = std::function<std::unique_ptr<Model>(const scenarios::Scenario&)>;
void set_python_model_loader(PythonModelLoader loader);

// The elements of a python: model's parameters and buffers, from the model its function builds
// (built once, unchecked): what the memory budget's estimate scales with. Set beside the loader.
using PythonModelSizer = std::function<double(const scenarios::Scenario&)>;
void set_python_model_sizer(PythonModelSizer sizer);

// The parameter elements a rank's model holds: the built model's for a python: model, the
// shapes' (scenarios::parameter_elements) otherwise.
[[nodiscard]] double model_parameter_elements(const scenarios::Scenario& scenario);

}  // namespace gradnorm::harness
