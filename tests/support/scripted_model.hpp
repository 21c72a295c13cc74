#pragma once
// Small TorchScript modules written with LibTorch's own jit API, saved to a file: the
// models a scenario names with model = "torchscript:PATH" in the tests.

#include <ATen/ATen.h>
#include <torch/csrc/jit/api/module.h>

#include <string>

namespace gradnorm::testing_support {

struct ScriptedModelOptions {
  long vocab = 11;
  long hidden = 6;
  bool integer_parameter = false;  // add an int64 parameter (a module gradnorm must refuse)
  bool trainable = true;           // parameters require grad
  std::string forward_name = "forward";
};

// A causal LM like the built-in one: embedding, causal prefix mean, tanh layer, LM head.
inline void save_scripted_causal_lm(const std::string& path, ScriptedModelOptions o = {}) {
  torch::jit::Module module("ScriptedCausalLM");
  at::Generator generator = at::detail::createCPUGenerator(1234);
  auto param = [&](const std::string& name, at::IntArrayRef shape, double scale) {
    at::Tensor value = at::randn(shape, generator, at::kFloat) * scale;
    value.set_requires_grad(o.trainable);
    module.register_parameter(name, value, /*is_buffer=*/false);
  };
  param("embedding", {o.vocab, o.hidden}, 1.0);
  param("hidden_w", {o.hidden, o.hidden}, 0.4);
  param("hidden_b", {o.hidden}, 0.1);
  param("head_w", {o.vocab, o.hidden}, 0.4);
  param("head_b", {o.vocab}, 0.1);
  if (o.integer_parameter) {
    module.register_parameter("step_count", at::zeros({1}, at::kLong), false);
  }
  module.define("def " + o.forward_name + R"((self, tokens: Tensor) -> Tensor:
    x = torch.embedding(self.embedding, tokens)
    counts = torch.arange(1, tokens.size(1) + 1, dtype=x.dtype).view(1, -1, 1)
    mixed = x.cumsum(1) / counts
    h = torch.tanh(torch.matmul(mixed, self.hidden_w.t()) + self.hidden_b)
    return torch.matmul(h, self.head_w.t()) + self.head_b
)");
  module.save(path);
}

}  // namespace gradnorm::testing_support
