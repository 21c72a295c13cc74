#include "gradnorm/harness/model.hpp"
#include "gradnorm/harness/dtype.hpp"
#include "gradnorm/harness/runner.hpp"
#include "recent_cache.hpp"
#include "torchscript_model.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <exception>
#include <mutex>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace gradnorm::harness {
namespace {

constexpr std::uint64_t kModelStream = 0x6d6f64656cULL;  // keeps model draws apart from batches
constexpr std::uint64_t kTeacherStream = 0x7465616368ULL;  // and the teacher's apart from both

// The built-in models: a causal LM, a linear head on features, the token probe; LoRA
// adapters and fake quantisation as the recipe asks.
class ZooModel final : public Model {
 public:
  ZooModel(const scenarios::Scenario& scenario, ModelConfig config);
  const std::vector<Parameter>& parameters() const override { return parameters_; }
  at::Tensor logits(const MicroBatch& batch) const override;
  at::Tensor logits_at(const MicroBatch& batch, const at::Tensor& rows) const override;
  std::unique_ptr<Model> converted(c10::ScalarType dtype) const override;

 private:
  ZooModel() = default;
  [[nodiscard]] const at::Tensor& get(const std::string& name) const;
  [[nodiscard]] at::Tensor linear_weight(const std::string& name) const;
  [[nodiscard]] at::Tensor adapted_linear(const at::Tensor& input, const std::string& layer) const;
  // The causal mixing: each position's mean of its prefix's embeddings, [B, T, H].
  [[nodiscard]] at::Tensor mixed(const MicroBatch& batch) const;

  ModelConfig config_;
  double lora_scale_ = 2.0;
  std::vector<Parameter> parameters_;
};

// The float64 draws of recent models, by everything that decides them: every rank of every
// variant of a scenario starts from the same draws, so they are drawn once and copied. A few
// scenarios' models, a few MiB at most.
using DrawCache = RecentCache<std::shared_ptr<const std::vector<at::Tensor>>, 32>;

DrawCache& draw_cache() {
  static DrawCache cache;
  return cache;
}

ZooModel::ZooModel(const scenarios::Scenario& s, ModelConfig config) : config_(config) {
  const long vocab = s.vocab_size;
  const long hidden = s.hidden_size;
  const long rank = s.lora_rank;
  const c10::ScalarType dtype = scalar_type(s.dtype);
  const std::string key = fmt::format("{} {} {} {} {} {} {} {} {}", s.seed, config.teacher,
                                      static_cast<int>(config.base), config.lora, vocab, hidden,
                                      rank, s.world_size * s.accumulation_steps,
                                      s.micro_batch_size * s.sequence_length);
  const std::shared_ptr<const std::vector<at::Tensor>> cached = draw_cache().find(key).value_or(nullptr);
  std::vector<at::Tensor> drawn;
  std::optional<at::Generator> generator;
  if (!cached) {
    generator = at::detail::createCPUGenerator(
        derive_seed(s.seed, {config.teacher ? kTeacherStream : kModelStream}));
  }
  struct StoreOnExit {
    const std::string& key;
    std::vector<at::Tensor>& drawn;
    bool hit;
    ~StoreOnExit() {
      // Only a complete draw: a constructor that threw leaves nothing behind.
      if (!hit && !drawn.empty() && std::uncaught_exceptions() == 0) {
        draw_cache().store(key, std::make_shared<const std::vector<at::Tensor>>(drawn));
      }
    }
  } store_on_exit{key, drawn, cached != nullptr};
  auto draw = [&](std::string name, at::IntArrayRef shape, double scale, bool trainable) {
    trainable = trainable && !config.teacher;
    at::Tensor exact;
    if (cached) {
      exact = (*cached)[drawn.size()];
    } else {
      exact = at::randn(shape, *generator, at::kDouble) * scale;
    }
    drawn.push_back(exact);
    // Always a copy: the model trains its parameters in place, the cache must not change.
    at::Tensor value = exact.to(dtype, /*non_blocking=*/false, /*copy=*/true);
    value.set_requires_grad(trainable);
    parameters_.push_back(Parameter{std::move(name), value, trainable});
  };
  const double fan_in = 1.0 / std::sqrt(static_cast<double>(hidden));
  TORCH_INTERNAL_ASSERT(config.base != scenarios::ModelKind::lora,
                        "harness bug: a model config names lora as its base");
  if (config.base == scenarios::ModelKind::token_probe) {
    // Zeros: every logit starts equal, so a token's gradient row is w * (1/V - onehot(y)).
    const long rows = static_cast<long>(s.world_size) * s.accumulation_steps *
                      s.micro_batch_size * s.sequence_length;
    if (config.teacher) {
      draw("probe.weight", {rows, vocab}, 1.0, false);
      return;
    }
    at::Tensor value = at::zeros({rows, vocab}, at::TensorOptions().dtype(dtype));
    value.set_requires_grad(true);
    parameters_.push_back(Parameter{"probe.weight", value, true});
    return;
  }
  const bool base_trainable = !config.lora;
  const bool causal = config.base == scenarios::ModelKind::causal_lm;
  if (causal) {
    draw("embedding.weight", {vocab, hidden}, 1.0, base_trainable);
    draw("hidden.weight", {hidden, hidden}, fan_in, base_trainable);
    draw("hidden.bias", {hidden}, 0.1, base_trainable);
  }
  draw("head.weight", {vocab, hidden}, fan_in, base_trainable);
  draw("head.bias", {vocab}, 0.1, base_trainable);
  if (config.lora) {
    // torchtune zero-initialises lora_b; a small non-zero start gives both adapters a
    // gradient at the first step, which is what the normalisation checks need.
    if (causal) {
      draw("hidden.lora_a", {rank, hidden}, fan_in, true);
      draw("hidden.lora_b", {hidden, rank}, 0.1, true);
    }
    draw("head.lora_a", {rank, hidden}, fan_in, true);
    draw("head.lora_b", {vocab, rank}, 0.1, true);
  }
}

const at::Tensor& ZooModel::get(const std::string& name) const {
  for (const Parameter& p : parameters_) {
    if (p.name == name) return p.value;
  }
  TORCH_INTERNAL_ASSERT(false, "harness bug: model has no parameter ", name);
}

at::Tensor ZooModel::linear_weight(const std::string& name) const {
  const at::Tensor& weight = get(name);
  if (!config_.fake_quantize) return weight;
  // Symmetric per-row int4 fake quantisation with a straight-through estimator; the scale
  // and rounding are computed in at least float32, as QAT kernels do.
  const c10::ScalarType compute = at::promote_types(weight.scalar_type(), at::kFloat);
  const at::Tensor w = weight.detach().to(compute);
  const at::Tensor scale = w.abs().amax({1}, /*keepdim=*/true).clamp_min(1e-12) / 7.0;
  const at::Tensor quantised = (w / scale).round().clamp(-8, 7) * scale;
  return weight + (quantised.to(weight.scalar_type()) - weight.detach());
}

at::Tensor ZooModel::adapted_linear(const at::Tensor& input, const std::string& layer) const {
  const std::string bias_name = layer + ".bias";
  bool has_bias = false;
  for (const Parameter& p : parameters_) has_bias = has_bias || p.name == bias_name;
  at::Tensor out = has_bias ? at::linear(input, linear_weight(layer + ".weight"), get(bias_name))
                            : at::linear(input, linear_weight(layer + ".weight"));
  if (config_.lora) {
    const at::Tensor low_rank =
        at::linear(at::linear(input, get(layer + ".lora_a")), get(layer + ".lora_b"));
    out = out + low_rank * lora_scale_;
  }
  return out;
}

at::Tensor ZooModel::mixed(const MicroBatch& batch) const {
  const at::Tensor& embedding = get("embedding.weight");
  const long sequences = batch.inputs.size(0);
  const long length = batch.inputs.size(1);
  const at::Tensor embedded =
      embedding.index_select(0, batch.inputs.reshape({-1})).view({sequences, length, -1});
  // Causal mixing: each position averages the embeddings of its prefix.
  const at::Tensor counts =
      at::arange(1, length + 1, embedded.options().requires_grad(false)).view({1, length, 1});
  return embedded.cumsum(1) / counts;
}

at::Tensor ZooModel::logits(const MicroBatch& batch) const {
  if (config_.base == scenarios::ModelKind::token_probe) {
    const at::Tensor& table = get("probe.weight");
    return table.index_select(0, batch.inputs.reshape({-1}))
        .view({batch.inputs.size(0), batch.inputs.size(1), -1});
  }
  if (config_.base == scenarios::ModelKind::linear_head) {
    return adapted_linear(batch.inputs, "head");
  }
  const at::Tensor hidden = at::tanh(adapted_linear(mixed(batch), "hidden"));
  return adapted_linear(hidden, "head");
}

at::Tensor ZooModel::logits_at(const MicroBatch& batch, const at::Tensor& rows) const {
  // Past the causal mixing every layer works on each position alone, so the rows can be
  // picked before them.
  if (config_.base == scenarios::ModelKind::token_probe) {
    return get("probe.weight").index_select(0, batch.inputs.reshape({-1}).index_select(0, rows));
  }
  const at::Tensor positions =
      config_.base == scenarios::ModelKind::linear_head ? batch.inputs : mixed(batch);
  const at::Tensor picked = positions.reshape({-1, positions.size(-1)}).index_select(0, rows);
  if (config_.base == scenarios::ModelKind::linear_head) return adapted_linear(picked, "head");
  return adapted_linear(at::tanh(adapted_linear(picked, "hidden")), "head");
}

std::unique_ptr<Model> ZooModel::converted(c10::ScalarType dtype) const {
  std::unique_ptr<ZooModel> copy(new ZooModel());
  copy->config_ = config_;
  copy->lora_scale_ = lora_scale_;
  for (const Parameter& p : parameters_) {
    at::Tensor value = p.value.detach().to(dtype).clone();
    value.set_requires_grad(p.trainable);
    copy->parameters_.push_back(Parameter{p.name, value, p.trainable});
  }
  return copy;
}

}  // namespace

at::Tensor Model::logits_at(const MicroBatch& batch, const at::Tensor& rows) const {
  const at::Tensor all = logits(batch);
  return all.reshape({-1, all.size(-1)}).index_select(0, rows);
}

std::vector<at::Tensor> Model::trainable_tensors() const {
  std::vector<at::Tensor> out;
  for (const Parameter& p : parameters()) {
    if (p.trainable) out.push_back(p.value);
  }
  return out;
}

namespace {

// What gradnorm::python installs (python::install_python_models), read under one mutex;
// function-local, as a test may install them during static initialisation.
struct PythonHooks {
  std::mutex mutex;
  PythonModelLoader loader;
  PythonModelSizer sizer;
};
PythonHooks& python_hooks() {
  static PythonHooks hooks;
  return hooks;
}

template <class Hook>
Hook installed(Hook PythonHooks::*hook) {
  PythonHooks& hooks = python_hooks();
  std::lock_guard lock(hooks.mutex);
  return hooks.*hook;
}

template <class Hook>
void install(Hook PythonHooks::*hook, Hook value) {
  PythonHooks& hooks = python_hooks();
  std::lock_guard lock(hooks.mutex);
  hooks.*hook = std::move(value);
}

}  // namespace

void set_python_model_loader(PythonModelLoader loader) { install(&PythonHooks::loader, std::move(loader)); }

void set_python_model_sizer(PythonModelSizer sizer) { install(&PythonHooks::sizer, std::move(sizer)); }

double model_parameter_elements(const scenarios::Scenario& scenario) {
  if (scenario.model != scenarios::ModelKind::python) return scenarios::parameter_elements(scenario);
  const PythonModelSizer sizer = installed(&PythonHooks::sizer);
  return sizer ? sizer(scenario) : scenarios::parameter_elements(scenario);
}

std::unique_ptr<Model> make_model(const scenarios::Scenario& scenario, ModelConfig config) {
  if (scenarios::model_from_file(config.base)) {
    TORCH_INTERNAL_ASSERT(!config.lora && !config.fake_quantize,
                          "harness bug: LoRA or QAT asked of a model from a file");
  }
  if (config.base == scenarios::ModelKind::torchscript) return load_torchscript_model(scenario);
  if (config.base == scenarios::ModelKind::python) {
    const PythonModelLoader loader = installed(&PythonHooks::loader);
    if (!loader) {
      throw scenarios::InvalidInput(fmt::format(
          "scenario '{}': model 'python:{}:{}' needs gradnorm's embedded Python, which this "
          "program does not link (gradnorm::python)",
          scenario.name, scenario.model_file, scenario.model_function));
    }
    if (config.teacher) {
      // A distilling recipe's teacher: the same function, built from the teacher's own seed
      // stream (as the built-in teachers are drawn), so its logits differ from the student's
      // from the first step. Used under no_grad only.
      scenarios::Scenario drawn = scenario;
      drawn.seed = derive_seed(scenario.seed, {kTeacherStream});
      return loader(drawn);
    }
    return loader(scenario);
  }
  return std::make_unique<ZooModel>(scenario, config);
}

std::string model_source(const scenarios::Scenario& s) {
  if (s.model == scenarios::ModelKind::python) {
    return fmt::format("python:{}:{}", s.model_file, s.model_function);
  }
  if (s.model == scenarios::ModelKind::torchscript) return "torchscript:" + s.model_file;
  return std::string(scenarios::to_string(s.model));
}

void check_model_is_a_function(const scenarios::Scenario& s, const Model& model) {
  if (!scenarios::model_from_file(s.model)) return;
  auto refuse = [&](const std::string& why) {
    return scenarios::InvalidInput(fmt::format(
        "scenario '{}': model '{}' {}; the oracle replays the model in float64 and needs the "
        "very function the step trains",
        s.name, model_source(s), why));
  };
  // The first micro-batch the scenario gives (rank 0, step 0): real token ids, not zeros.
  const std::vector<MicroBatch> window = make_rank_window(s, 0, 0);
  if (window.empty()) return;
  const MicroBatch& batch = window.front();
  const std::unique_ptr<Model> twin = model.converted(at::kDouble);
  auto state = [&] {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (auto& [name, value] : twin->buffers()) out.emplace_back(name, value.detach().clone());
    return out;
  };
  auto torch_error = [&](const char* what, const c10::Error& error) {
    return refuse(fmt::format("{}: {}", what, first_line(error.what_without_backtrace())));
  };
  const auto state_before = state();
  at::Tensor first;
  try {
    first = twin->logits(batch);
  } catch (const c10::Error& error) {
    throw torch_error("raised in its float64 forward", error);
  }
  if (!first.is_floating_point()) return;  // the loading checks name a wrong output
  if (!at::isfinite(first).all().item<bool>()) {
    const long bad = (~at::isfinite(first)).sum().item<long>();
    throw refuse(fmt::format("gives non-finite logits ({} of {} values) on the scenario's first "
                             "micro-batch in float64: no step can be judged against a model "
                             "that computes none",
                             bad, first.numel()));
  }
  if (first.requires_grad()) {
    std::vector<at::Tensor> gradients;
    const std::vector<at::Tensor> trainable = twin->trainable_tensors();
    try {
      gradients = torch::autograd::grad({first.sum()}, trainable, {}, false, false, true);
    } catch (const c10::Error& error) {
      throw torch_error("cannot be differentiated in float64 (its forward changes in place a "
                        "tensor its backward needs?)",
                        error);
    }
    // A trainable parameter the logits do not depend on gets no gradient: one device failed
    // its baseline with a reason naming another parameter, two ranks passed.
    std::vector<std::string> unused;
    std::size_t at = 0;
    for (const Parameter& p : twin->parameters()) {
      if (!p.trainable) continue;
      if (at < gradients.size() && !gradients[at].defined()) unused.push_back("'" + p.name + "'");
      ++at;
    }
    if (!unused.empty()) {
      throw refuse(fmt::format("has trainable parameter{} {} that the logits do not depend on (no "
                               "gradient reaches {}): freeze {} (requires_grad_(False)) or use {} "
                               "in forward",
                               unused.size() == 1 ? "" : "s", fmt::join(unused, ", "),
                               unused.size() == 1 ? "it" : "them", unused.size() == 1 ? "it" : "them",
                               unused.size() == 1 ? "it" : "them"));
    }
  }
  const auto state_after = state();
  for (std::size_t i = 0; i < state_before.size() && i < state_after.size(); ++i) {
    const at::Tensor& a = state_before[i].second;
    const at::Tensor& b = state_after[i].second;
    if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type() || !at::equal(a, b)) {
      throw refuse(fmt::format("changes its buffer '{}' in forward: each forward (the step's "
                               "micro-batches, the oracle's replay) would meet another model; "
                               "keep forward free of state (module.eval() stops BatchNorm's "
                               "running statistics)",
                               state_before[i].first));
    }
  }
  at::Tensor second;
  {
    at::NoGradGuard no_grad;
    second = twin->logits(batch);
  }
  if (!at::equal(first.detach(), second)) {
    const double gap = (first.detach() - second).abs().max().item<double>();
    throw refuse(fmt::format("is not a function of its token ids: two float64 forwards of the "
                             "scenario's first micro-batch differ by up to {:.3g} (dropout in "
                             "training mode, or a random draw in forward); call module.eval() "
                             "in the builder or draw nothing in forward",
                             gap));
  }
}

}  // namespace gradnorm::harness
