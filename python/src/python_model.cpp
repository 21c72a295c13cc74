// Models from Python files (model = "python:FILE.py:FUNCTION"): the torch.nn.Module a
// user's function returns, trained as it is. Its parameters are the module's own tensors
// (torch's caster wraps the very TensorImpl), so what the harness's optimizer updates and
// records is what the module computes with; every forward runs the module's own Python.
//
// Determinism: each distinct model is built once per process, before any row runs
// (tools' preflight), with torch's generator seeded from the scenario's seed; every rank's
// model and the oracle's float64 twin are deep copies of that one build.
#include "python_model.hpp"

#include "gradnorm/python/python_step.hpp"
#include "interpreter.hpp"
#include "watchdog.hpp"

#include <pybind11/stl.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "gradnorm/harness/runner.hpp"
#include "gradnorm/harness/step.hpp"

namespace py = pybind11;

namespace gradnorm::python {
namespace {

using detail::describe;
using detail::Interpreter;
using detail::loading_watchdog;
using detail::step_timeout_ms;
using detail::Watchdog;
using scenarios::InvalidInput;

std::string dtype_name(const scenarios::Scenario& s) { return std::string(to_string(s.dtype)); }

std::string shape_of(const at::Tensor& t) { return fmt::format("{}", t.sizes().vec()); }

// Where a model comes from, shared by a model and its float64 twin: what messages cite.
struct Origin {
  explicit Origin(const scenarios::Scenario& s)
      : scenario(s.name),
        where(fmt::format("python:{}:{}", s.model_file, s.model_function)),
        file(s.model_file),
        scenario_dtype(to_string(s.dtype)) {}
  std::string scenario;
  std::string where;  // "python:FILE:FUNCTION"
  std::string file;
  std::string scenario_dtype;  // the scenario's (the oracle's twin is float64)
};

class PythonModel final : public harness::Model {
 public:
  // With the GIL held. `module` is this model's own (a copy no other model shares), its
  // parameters in `dtype`.
  PythonModel(py::object module, Origin origin, std::string dtype)
      : module_(module.release().ptr()), origin_(std::move(origin)), dtype_(std::move(dtype)) {
    // The module's parameters in named_parameters order (shared ones once), as its tensors.
    for (py::handle item : py::handle(module_).attr("named_parameters")()) {
      const auto pair = item.cast<py::tuple>();
      const auto tensor = pair[1].cast<at::Tensor>();
      parameters_.push_back(
          harness::Parameter{pair[0].cast<std::string>(), tensor, tensor.requires_grad()});
    }
  }
  ~PythonModel() override {
    py::gil_scoped_acquire gil;
    Py_DECREF(module_);
  }
  PythonModel(const PythonModel&) = delete;
  PythonModel& operator=(const PythonModel&) = delete;

  const std::vector<harness::Parameter>& parameters() const override { return parameters_; }

  at::Tensor logits(const harness::MicroBatch& batch) const override {
    py::gil_scoped_acquire gil;
    // Bounded by --timeout unless a Python step's call already is (it calls this forward).
    Watchdog watchdog(
        [](std::chrono::milliseconds) {},
        [this](std::chrono::milliseconds timeout) {
          return fmt::format("run aborted: scenario '{}': model '{}' hung in forward: it ignored "
                             "the harness's interrupt for {} ms after its {} ms timeout (hang)",
                             origin_.scenario, origin_.where, timeout.count(), timeout.count());
        },
        3);
    try {
      return Interpreter::get()
          .runtime()
          .attr("model_logits")(py::handle(module_), batch.inputs, dtype_, origin_.scenario_dtype)
          .cast<at::Tensor>();
    } catch (py::error_already_set& error) {
      if (watchdog.expired()) {
        // As an error it raised: neither the step nor the oracle can run this model.
        throw InvalidInput(fmt::format("scenario '{}': model '{}' did not return from forward "
                                       "on the scenario's batches within {} ms (--timeout)",
                                       origin_.scenario, origin_.where, step_timeout_ms.load()));
      }
      // The module cannot run on the scenario's own batches (it passed the check on token
      // ids of zeros): neither the step nor the oracle can, so no verdict can be had.
      const auto [type, message] = describe(error, origin_.file);
      throw InvalidInput(fmt::format("scenario '{}': model '{}' raised in forward on the "
                                     "scenario's batches ({} parameters, token ids {}): {}: {}",
                                     origin_.scenario, origin_.where, dtype_,
                                     shape_of(batch.inputs), type, message));
    }
  }

  std::unique_ptr<Model> converted(c10::ScalarType dtype) const override {
    py::gil_scoped_acquire gil;
    TORCH_INTERNAL_ASSERT(dtype == at::kDouble || dtype == at::kFloat || dtype == at::kBFloat16,
                          "harness bug: a Python model converted to ", dtype);
    const std::string name(dtype == at::kDouble     ? "float64"
                           : dtype == at::kBFloat16 ? "bfloat16"
                                                    : "float32");
    py::object copy = Interpreter::get().runtime().attr("model_copy")(py::handle(module_), name);
    return std::make_unique<PythonModel>(std::move(copy), origin_, name);
  }

  std::vector<std::pair<std::string, at::Tensor>> buffers() const override {
    py::gil_scoped_acquire gil;
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (py::handle item : py::handle(module_).attr("named_buffers")()) {
      const auto pair = item.cast<py::tuple>();
      if (pair[1].is_none()) continue;
      out.emplace_back(pair[0].cast<std::string>(), pair[1].cast<at::Tensor>());
    }
    return out;
  }

  // The module itself: what a Python step's ctx.model is.
  [[nodiscard]] py::object module() const { return py::reinterpret_borrow<py::object>(module_); }

 private:
  PyObject* module_;
  Origin origin_;
  std::string dtype_;  // the parameters' ("float32")
  std::vector<harness::Parameter> parameters_;
};

// Each distinct model, built once per process and never released (like loaded steps, its
// Python objects outlive static destruction).
struct Built {
  PyObject* prototype = nullptr;
  std::set<std::pair<std::string, long>> checked;  // (dtype, micro_batch_size) validated
};

// Taken before the GIL, never while holding it: a thread holding the GIL never waits here.
std::mutex build_mutex;

// Builds the scenario's model (once per process) and, unless `elements` asks only for its size
// (the memory budget's, before the model check runs), checks it and returns a rank's copy.
std::unique_ptr<harness::Model> build(const scenarios::Scenario& s, double* elements) {
  const std::string where = fmt::format("python:{}:{}", s.model_file, s.model_function);
  auto refuse = [&](const std::string& why) {
    return InvalidInput(fmt::format("scenario '{}': model '{}' {}", s.name, where, why));
  };
  std::error_code ignored;
  if (!std::filesystem::exists(s.model_file, ignored)) throw refuse(fmt::format("names '{}', which does not exist", s.model_file));
  if (!std::filesystem::is_regular_file(s.model_file, ignored)) {
    throw refuse(fmt::format("names '{}', which is not a regular file", s.model_file));
  }

  std::lock_guard lock(build_mutex);
  static auto& built = *new std::map<std::string, Built>();
  static auto& functions = *new std::map<std::pair<std::string, std::string>, PyObject*>();
  Interpreter& interpreter = Interpreter::get();
  py::gil_scoped_acquire gil;
  py::module_ runtime = interpreter.runtime();

  // Each call into the file's code before any row runs, bounded by --timeout: past it an
  // input error "WHAT within N ms", past another exit 2 (watchdog.hpp).
  auto bounded = [&](const std::string& what, auto&& call) {
    const auto watchdog = loading_watchdog(fmt::format("scenario '{}': model '{}' {}", s.name, where, what));
    try {
      return call();
    } catch (py::error_already_set&) {
      if (watchdog->expired()) {
        throw refuse(fmt::format("{} within {} ms (--timeout): it hangs or takes longer", what,
                                 step_timeout_ms.load()));
      }
      throw;
    }
  };

  const auto source = std::make_pair(s.model_file, s.model_function);
  if (!functions.count(source)) {
    try {
      functions[source] = bounded("did not load", [&] {
                            return runtime.attr("load_step")(
                                s.model_file, s.model_function,
                                detail::module_name_for("model", s.model_file));
                          }).release().ptr();
    } catch (py::error_already_set& error) {
      const auto [type, message] = describe(error, s.model_file);
      throw refuse(fmt::format("does not load: {}: {}", type, message));
    }
  }
  const std::string key = fmt::format("{}\n{}\nV={} H={} T={} seed={}", s.model_file,
                                      s.model_function, s.vocab_size, s.hidden_size,
                                      s.sequence_length, s.seed);
  Built& entry = built[key];
  if (entry.prototype == nullptr) {
    try {
      entry.prototype = bounded("was not built", [&] {
                          return runtime.attr("build_model")(
                              py::handle(functions[source]), s.model_file, where, s.vocab_size,
                              s.hidden_size, s.sequence_length, s.seed);
                        }).release().ptr();
    } catch (py::error_already_set& error) {
      const auto [type, message] = describe(error, s.model_file);
      built.erase(key);
      throw refuse(fmt::format("could not be built with vocab_size={}, hidden_size={}, "
                               "sequence_length={}: {}: {}",
                               s.vocab_size, s.hidden_size, s.sequence_length, type, message));
    } catch (...) {
      built.erase(key);
      throw;
    }
  }

  if (elements != nullptr) {
    *elements = runtime.attr("parameter_elements")(py::handle(entry.prototype)).cast<double>();
    return nullptr;
  }

  const std::string dtype = dtype_name(s);
  py::object copy;
  try {
    copy = bounded("was not copied", [&] {
      return runtime.attr("model_copy")(py::handle(entry.prototype), dtype);
    });
  } catch (py::error_already_set& error) {
    const auto [type, message] = describe(error, s.model_file);
    throw refuse(fmt::format("cannot be copied and converted to {}: {}: {}", dtype, type, message));
  }
  auto model = std::make_unique<PythonModel>(copy, Origin(s), dtype);
  if (entry.checked.count({dtype, s.micro_batch_size})) return model;

  // What a step relies on, checked once per dtype and batch size.
  bool any_trainable = false;
  for (const harness::Parameter& p : model->parameters()) {
    if (!p.value.is_floating_point()) {
      throw refuse(fmt::format("has parameter '{}' of type {}: every parameter must be floating "
                               "point",
                               p.name, c10::toString(p.value.scalar_type())));
    }
    if (!p.value.device().is_cpu()) {
      // A meta tensor has shapes and no storage: the digest read its data and crashed.
      throw refuse(fmt::format("has parameter '{}' on the {} device: gradnorm trains and "
                               "compares the model on the CPU (build it there)",
                               p.name, c10::DeviceTypeName(p.value.device().type(), /*lower_case=*/true)));
    }
    any_trainable = any_trainable || p.trainable;
  }
  if (model->parameters().empty()) throw refuse("has no parameters: nothing to train");
  // A sparse gradient reached the harness's optimizer as an internal error (exit 70: "add(sparse,
  // dense) is not supported").
  if (const auto sparse = runtime.attr("sparse_gradient_modules")(model->module()).cast<std::vector<std::string>>();
      !sparse.empty()) {
    throw refuse(fmt::format("has {} built with sparse=True: its gradient is a sparse tensor, and "
                             "gradnorm's optimizer, clip and oracle take dense ones (build it "
                             "with sparse=False)",
                             fmt::join(sparse, ", ")));
  }
  if (!any_trainable) throw refuse("has no parameter that requires grad: nothing to train");
  const at::Tensor ids =
      at::zeros({s.micro_batch_size, s.sequence_length}, at::TensorOptions().dtype(at::kLong));
  // The step's model and the oracle's float64 twin.
  std::vector<std::string> dtypes{dtype};
  if (dtype != "float64") dtypes.emplace_back("float64");
  for (const std::string& as : dtypes) {
    at::Tensor logits;
    try {
      at::NoGradGuard no_grad;
      logits = bounded(fmt::format("did not run forward(token ids {}) with {} parameters",
                                   shape_of(ids), as),
                       [&] {
                         const py::object module =
                             as == dtype ? model->module()
                                         : runtime.attr("model_copy")(model->module(), as);
                         return runtime.attr("model_logits")(module, ids, as, dtype);
                       })
                   .cast<at::Tensor>();
    } catch (py::error_already_set& error) {
      const auto [type, message] = describe(error, s.model_file);
      throw refuse(fmt::format("cannot run forward(token ids {}) with {} parameters{}: {}: {}",
                               shape_of(ids), as,
                               as == dtype ? "" : " (the oracle's twin)", type, message));
    }
    const std::vector<long> want{s.micro_batch_size, s.sequence_length, s.vocab_size};
    if (logits.sizes().vec() != want) {
      throw refuse(fmt::format("maps token ids {} to logits {}; expected [{}, {}, {}] "
                               "(micro_batch_size, sequence_length, vocab_size)",
                               shape_of(ids), shape_of(logits), want[0], want[1], want[2]));
    }
  }
  entry.checked.insert({dtype, s.micro_batch_size});
  return model;
}

}  // namespace

namespace detail {

py::object module_of(const harness::Model& model) {
  if (const auto* python = dynamic_cast<const PythonModel*>(&model)) return python->module();
  return py::none();
}

}  // namespace detail

void install_python_models() {
  harness::set_python_model_loader([](const scenarios::Scenario& s) { return build(s, nullptr); });
  harness::set_python_model_sizer([](const scenarios::Scenario& s) {
    double elements = 0;
    build(s, &elements);
    return elements;
  });
}

}  // namespace gradnorm::python
