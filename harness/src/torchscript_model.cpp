#include "torchscript_model.hpp"
#include "gradnorm/harness/dtype.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/serialization/import.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

namespace gradnorm::harness {
namespace {

class TorchScriptModel final : public Model {
 public:
  explicit TorchScriptModel(torch::jit::Module module) : module_(std::move(module)) {
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      parameters_.push_back(Parameter{p.name, p.value, p.value.requires_grad()});
    }
  }

  const std::vector<Parameter>& parameters() const override { return parameters_; }

  at::Tensor logits(const MicroBatch& batch) const override {
    return module_.forward({batch.inputs}).toTensor();
  }

  std::vector<std::pair<std::string, at::Tensor>> buffers() const override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) out.emplace_back(b.name, b.value);
    return out;
  }

  std::unique_ptr<Model> converted(c10::ScalarType dtype) const override {
    torch::jit::Module copy = module_.deepcopy();
    at::NoGradGuard no_grad;
    copy.to(dtype);
    return std::make_unique<TorchScriptModel>(std::move(copy));
  }

 private:
  // forward() is not const in LibTorch; calling it changes nothing a caller can see.
  mutable torch::jit::Module module_;
  std::vector<Parameter> parameters_;
};

std::string shape_of(const at::Tensor& t) { return fmt::format("{}", t.sizes().vec()); }

}  // namespace

std::unique_ptr<Model> load_torchscript_model(const scenarios::Scenario& s) {
  const std::string& file = s.model_file;
  auto refuse = [&](const std::string& why) {
    return scenarios::InvalidInput(
        fmt::format("scenario '{}': model file '{}' {}", s.name, file, why));
  };
  std::error_code error;
  if (!std::filesystem::exists(file, error)) throw refuse("does not exist");
  if (!std::filesystem::is_regular_file(file, error)) throw refuse("is not a regular file");

  // Unoptimised graph execution, so every call runs the same kernels: the optimising
  // executor would otherwise change them after the first call (about 1 ULP apart).
  torch::jit::setGraphExecutorOptimize(false);
  torch::jit::Module module;
  try {
    module = torch::jit::load(file);
  } catch (const c10::Error& e) {
    throw refuse(fmt::format("is not a TorchScript module: {}",
                             std::string(e.what_without_backtrace()).substr(0, 200)));
  }
  if (!module.find_method("forward")) throw refuse("has no forward method");
  bool any_trainable = false;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    if (!p.value.is_floating_point()) {
      throw refuse(fmt::format("has parameter '{}' of type {}: every parameter must be floating "
                               "point",
                               p.name, c10::toString(p.value.scalar_type())));
    }
    any_trainable = any_trainable || p.value.requires_grad();
  }
  if (!any_trainable) throw refuse("has no parameter that requires grad: nothing to train");
  {
    at::NoGradGuard no_grad;
    module.to(scalar_type(s.dtype));
  }

  // The signature a step relies on: token ids [B, T] -> logits [B, T, vocab_size].
  const at::Tensor ids =
      at::zeros({s.micro_batch_size, s.sequence_length}, at::TensorOptions().dtype(at::kLong));
  c10::IValue out;
  try {
    at::NoGradGuard no_grad;
    out = module.forward({ids});
  } catch (const std::exception& e) {
    throw refuse(fmt::format("cannot run forward(token ids {}): {}", shape_of(ids),
                             std::string(e.what()).substr(0, 200)));
  }
  if (!out.isTensor()) {
    throw refuse(fmt::format("forward returned {}, not a tensor of logits", out.tagKind()));
  }
  const at::Tensor logits = out.toTensor();
  const std::vector<long> want{s.micro_batch_size, s.sequence_length, s.vocab_size};
  if (logits.sizes().vec() != want || !logits.is_floating_point()) {
    throw refuse(fmt::format("maps token ids {} to {} {}; expected floating logits [{}, {}, {}] "
                             "(micro_batch_size, sequence_length, vocab_size)",
                             shape_of(ids), c10::toString(logits.scalar_type()),
                             shape_of(logits), want[0], want[1], want[2]));
  }
  return std::make_unique<TorchScriptModel>(std::move(module));
}

}  // namespace gradnorm::harness
