#pragma once
// The model zoo: small models whose parameters, gradients and forward pass live in the
// scenario's dtype. The recipe under test decides which model it trains (model_config_for).

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "gradnorm/harness/batch.hpp"
#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::harness {

struct ModelConfig {
  // causal_lm, linear_head or token_probe; scenarios::ModelKind::lora is causal_lm with
  // adapters.
  scenarios::ModelKind base = scenarios::ModelKind::causal_lm;
  // LoRA: base weights frozen, trainable low-rank adapters on every linear.
  bool lora = false;
  // QAT: the hidden and head weights are fake-quantised to int4 in the forward pass, with a
  // straight-through gradient.
  bool fake_quantize = false;
  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

struct Parameter {
  std::string name;
  at::Tensor value;  // a leaf; requires_grad == trainable
  bool trainable = true;
};

class Model {
 public:
  // Parameters drawn from the scenario's seed in float64, then rounded once to its dtype.
  Model(const scenarios::Scenario& scenario, ModelConfig config);

  [[nodiscard]] const std::vector<Parameter>& parameters() const { return parameters_; }
  [[nodiscard]] std::vector<at::Tensor> trainable_tensors() const;
  [[nodiscard]] const ModelConfig& config() const { return config_; }

  // Logits [B, T, V] in the parameters' dtype. Causal: position t sees inputs 0..t only.
  [[nodiscard]] at::Tensor logits(const MicroBatch& batch) const;

  // A detached copy with every parameter converted to `dtype` (the oracle's float64 twin).
  [[nodiscard]] Model converted(c10::ScalarType dtype) const;

 private:
  Model() = default;
  [[nodiscard]] const at::Tensor& get(const std::string& name) const;
  [[nodiscard]] at::Tensor linear_weight(const std::string& name) const;
  [[nodiscard]] at::Tensor adapted_linear(const at::Tensor& input, const std::string& layer) const;

  ModelConfig config_;
  double lora_scale_ = 2.0;
  std::vector<Parameter> parameters_;
};

}  // namespace gradnorm::harness
