// Python steps: an embedded CPython runs the user's `def step(ctx)` on the harness's own
// tensors (docs/design.md §10). Tensors cross without copies (torch's own caster, which
// wraps the very TensorImpl), so the gradients the harness records are the ones the
// step's backward produced.
//
// Locking: the interpreter is started once per process and its GIL released at once; every
// entry from C++ takes the GIL, and every harness call from Python (forward, loss,
// optimizer, collectives) gives it back while it runs, so rank threads interleave and a
// rank waiting in a collective never holds up its peers.
#include "gradnorm/python/python_step.hpp"

#include "interpreter.hpp"
#include "python_model.hpp"
#include "watchdog.hpp"

#include <pybind11/stl.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include <sys/stat.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "gradnorm/harness/communicator.hpp"
#include "gradnorm/harness/gloo_groups.hpp"
#include "gradnorm/harness/output_capture.hpp"
#include "gradnorm/harness/runner.hpp"
#include "gradnorm/harness/step.hpp"
#include "gradnorm/harness/training.hpp"
#include "gradnorm/scenarios/files.hpp"

namespace py = pybind11;

namespace gradnorm::python {
namespace {

using detail::describe;
using detail::exception_of;
using detail::Interpreter;
using detail::Interrupted;
using detail::TorchCallError;
using detail::Watchdog;
using detail::loading_watchdog;
using detail::step_timeout_ms;
using scenarios::InvalidInput;

std::string scenario_dtype(const scenarios::Scenario& s) { return std::string(to_string(s.dtype)); }

// The scenario as the step sees it: a dict of its fields.
py::dict scenario_facts(const scenarios::Scenario& s) {
  py::dict d;
  d["name"] = s.name;
  d["world_size"] = s.world_size;
  d["dp_replicate"] = s.dp_replicate;
  d["tp"] = s.tp;
  d["cp"] = s.cp;
  d["data_parallel_size"] = s.data_parallel_size();
  d["accumulation_steps"] = s.accumulation_steps;
  d["valid_tokens"] = s.valid_tokens;
  d["micro_batch_size"] = s.micro_batch_size;
  d["sequence_length"] = s.sequence_length;
  d["vocab_size"] = s.vocab_size;
  d["hidden_size"] = s.hidden_size;
  d["dtype"] = scenario_dtype(s);
  d["first_label"] = std::string(to_string(s.first_label));
  d["model"] = std::string(to_string(s.model));
  d["model_file"] = s.model_file;
  d["model_function"] = s.model_function;
  d["loss"] = std::string(to_string(s.loss));
  d["loss_chunks"] = s.loss_chunks;
  d["kd_ratio"] = s.kd_ratio;
  d["optimizer"] = std::string(to_string(s.optimizer));
  d["learning_rate"] = s.learning_rate;
  d["momentum"] = s.momentum;
  d["weight_decay"] = s.weight_decay;
  d["clip_max_norm"] = s.clip_max_norm ? py::object(py::float_(*s.clip_max_norm)) : py::object(py::none());
  d["optimizer_in_backward"] = s.optimizer_in_backward;
  d["rank_average"] = std::string(to_string(s.rank_average));
  d["steps"] = s.steps;
  d["seed"] = s.seed;
  return d;
}

// What Python holds of one rank of one run: the StepContext, reached through calls that
// give the GIL back while they run. A harness error raised inside such a call is kept and
// rethrown once the step returns, whatever the step did with the interrupt.
class RankHandle {
 public:
  explicit RankHandle(harness::StepContext& context) : context_(&context) {}

  // The rank's own thread, while the harness is inside a call of the step (or binding it):
  // the only time and place ctx may be used. Python may keep the model or the optimizer
  // (a global, a closure, a thread of its own); their calls then raise instead of reaching
  // a context that is gone or in use. Checked on the calling thread, so no race with close.
  void begin_call() { owner_ = std::this_thread::get_id(); }
  void end_call() { owner_ = std::thread::id(); }
  void close() {
    end_call();
    context_ = nullptr;
  }
  harness::StepContext& context() const {
    if (getpid() != harness_pid_) {
      // The rank's state (its communicator's sockets, its peers' rooms) belongs to the
      // harness's process; a forked child that used it would corrupt or deadlock the parent.
      throw std::runtime_error(
          "ctx, ctx.model and ctx.optimizer belong to the harness's process: this use comes "
          "from a process the step forked (a DataLoader worker, os.fork()), which may compute "
          "but not call the harness");
    }
    if (context_ == nullptr || owner_.load() != std::this_thread::get_id()) {
      throw std::runtime_error(
          "ctx, ctx.model and ctx.optimizer belong to one call of the step, on its own thread: "
          "this use comes from another thread or after the step returned");
    }
    return *context_;
  }

  template <typename Body>
  auto guarded(Body&& body) -> decltype(body()) {
    (void)context();  // a use out of place is the caller's error, raised as such
    try {
      return body();
    } catch (const c10::Error& error) {
      // What torch raises for the same call made in Python (a RuntimeError), marked as
      // LibTorch's so it is recorded as the c10::Error a C++ step would see.
      throw TorchCallError(harness::first_line(error.what_without_backtrace()));
    } catch (...) {
      set_pending(std::current_exception());
      throw Interrupted{};
    }
  }

  void rethrow_pending() {
    std::exception_ptr error;
    {
      std::lock_guard lock(pending_mutex_);
      error = std::exchange(pending_, nullptr);
    }
    if (error) std::rethrow_exception(error);
  }
  // The first harness error of the step wins.
  void set_pending(std::exception_ptr error) {
    std::lock_guard lock(pending_mutex_);
    if (!pending_) pending_ = std::move(error);
  }

  int rank() const { return context().rank(); }
  int world_size() const { return context().world_size(); }
  int step_index() const { return context().step_index(); }
  std::optional<double> max_norm() const { return context().max_norm(); }

  std::vector<std::tuple<std::string, at::Tensor, bool>> parameters() const {
    std::vector<std::tuple<std::string, at::Tensor, bool>> out;
    for (const harness::Parameter& p : context().model().parameters()) {
      out.emplace_back(p.name, p.value, p.trainable);
    }
    return out;
  }
  // The scenario's torch.nn.Module for a model from a Python file, else None.
  py::object python_model() const { return detail::module_of(context().model()); }
  // A distilling variant's frozen teacher (VariantSpec::objective), when it is a model from a
  // Python file, else None.
  py::object teacher_model() const {
    const harness::Model* teacher = context().teacher();
    return teacher == nullptr ? py::none() : detail::module_of(*teacher);
  }
  std::vector<std::tuple<at::Tensor, at::Tensor, at::Tensor>> micro_batches() const {
    std::vector<std::tuple<at::Tensor, at::Tensor, at::Tensor>> out;
    for (const harness::MicroBatch& b : context().micro_batches()) {
      out.emplace_back(b.inputs, b.labels, b.first_labels);
    }
    return out;
  }
  std::vector<std::tuple<at::Tensor, at::Tensor, at::Tensor>> micro_batches_of_step(int step) const {
    std::vector<std::tuple<at::Tensor, at::Tensor, at::Tensor>> out;
    for (const harness::MicroBatch& b : context().micro_batches_of_step(step)) {
      out.emplace_back(b.inputs, b.labels, b.first_labels);
    }
    return out;
  }
  at::Tensor logits(const at::Tensor& tokens) {
    return guarded([&] {
      harness::MicroBatch batch;
      batch.inputs = tokens;
      return context().model().logits(batch);
    });
  }
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& labels) {
    return guarded([&] { return context().loss(logits, labels); });
  }
  void optimizer_step() { guarded([&] { context().optimizer().step(); }); }
  void zero_grad(bool set_to_none) { guarded([&] { context().optimizer().zero_grad(set_to_none); }); }
  void all_reduce_sum(std::vector<at::Tensor> tensors) {
    guarded([&] { context().comm().all_reduce_sum(tensors); });
  }
  void barrier() { guarded([&] { context().comm().barrier(); }); }
  // What FSDP's reduce-scatter does inside a real recipe's backward: every trainable
  // gradient averaged over this rank's FSDP group, as the C++ recipes average it.
  void average_gradients() { guarded([&] { harness::training::rank_average(context()); }); }

  py::dict scenario() const { return scenario_facts(context().scenario()); }
  py::dict optimizer_facts() const {
    const scenarios::Scenario& s = context().scenario();
    py::dict d;
    d["optimizer"] = std::string(to_string(s.optimizer));
    d["lr"] = s.learning_rate;
    d["momentum"] = s.momentum;
    d["weight_decay"] = s.weight_decay;
    return d;
  }

 private:
  harness::StepContext* context_;
  pid_t harness_pid_ = getpid();
  std::atomic<std::thread::id> owner_{};
  std::mutex pending_mutex_;
  std::exception_ptr pending_;
};

}  // namespace
}  // namespace gradnorm::python

void gradnorm::python::detail::define_native_module(py::module_& m) {
  using gradnorm::python::RankHandle;
  using release = py::call_guard<py::gil_scoped_release>;
  py::class_<RankHandle, std::shared_ptr<RankHandle>>(m, "RankHandle")
      .def_property_readonly("rank", &RankHandle::rank)
      .def_property_readonly("world_size", &RankHandle::world_size)
      .def_property_readonly("max_norm", &RankHandle::max_norm)
      .def("step_index", &RankHandle::step_index)
      .def("scenario", &RankHandle::scenario)
      .def("optimizer_facts", &RankHandle::optimizer_facts)
      .def("parameters", &RankHandle::parameters)
      .def("python_model", &RankHandle::python_model)
      .def("teacher_model", &RankHandle::teacher_model)
      .def("micro_batches", &RankHandle::micro_batches)
      .def("micro_batches_of_step", &RankHandle::micro_batches_of_step)
      .def("logits", &RankHandle::logits, release())
      .def("loss", &RankHandle::loss, release())
      .def("optimizer_step", &RankHandle::optimizer_step, release())
      .def("zero_grad", &RankHandle::zero_grad, py::arg("set_to_none") = true, release())
      .def("all_reduce_sum", &RankHandle::all_reduce_sum, release())
      .def("barrier", &RankHandle::barrier, release())
      .def("average_gradients", &RankHandle::average_gradients, release());
  m.def("ranks_running_as_threads", &gradnorm::harness::ranks_running_as_threads);
  // gradnorm_torch's sys.stdout and sys.stderr ask first (harness/output_capture.hpp).
  m.def("hold_output", [](const py::bytes& text) {
    return gradnorm::harness::hold_output(static_cast<std::string_view>(text));
  });
}

namespace gradnorm::python {
namespace {

// A loaded step function, kept for the life of the process (never released: see Interpreter).
struct LoadedStep {
  std::string file;  // as the user named it: messages cite it so
  PyObject* function = nullptr;
  PyObject* cannot_run = nullptr;  // null when the module defines none
  // A recipe run keeps a greenlet suspended between the step's calls (gradnorm_frameworks.py);
  // a greenlet belongs to its thread's Python thread state, which must then live from the
  // first call to the last instead of being made and deleted around each call.
  bool keeps_thread_state = false;
};

// The exception a step raised, as the harness records it: a refusal, a LibTorch error
// (raised inside torch's own code, or inside a harness call: the c10::Error a C++ step
// would see), or the Python type with the message and the user's FILE:LINE.
[[noreturn]] void rethrow_step_error(py::error_already_set& error, const LoadedStep& step) {
  std::string kind;
  try {
    kind = Interpreter::get().runtime().attr("classify")(exception_of(error)).cast<std::string>();
  } catch (const std::exception&) {
    kind = "step";
  }
  const auto [type, message] = describe(error, step.file, step.function);
  if (kind == "refusal") throw harness::RecipeRefusal(message.substr(0, message.rfind(" (at ")));
  if (kind == "torch") throw harness::StepError("c10::Error", message.substr(0, message.rfind(" (at ")));
  throw harness::StepError(type, message);
}

// A step that does not return in time: its rank's error ("hung"), and past another timeout
// exit 3 with the rank named.
std::unique_ptr<Watchdog> step_watchdog(RankHandle& handle, int rank) {
  return std::make_unique<Watchdog>(
      [&handle](std::chrono::milliseconds timeout) {
        handle.set_pending(std::make_exception_ptr(std::runtime_error(fmt::format(
            "hung: its Python step did not return within {} ms (hang)", timeout.count()))));
      },
      [rank](std::chrono::milliseconds timeout) {
        return fmt::format("run aborted: rank {} hung: its Python step ignored the harness's "
                           "interrupt for {} ms after its {} ms timeout (hang)",
                           rank, timeout.count(), timeout.count());
      },
      3);
}

// The harness is inside a call of the step for this object's life.
class Call {
 public:
  explicit Call(RankHandle& handle) : handle_(handle) { handle_.begin_call(); }
  ~Call() { handle_.end_call(); }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

 private:
  RankHandle& handle_;
};

class PythonStep final : public harness::Step {
 public:
  explicit PythonStep(const LoadedStep& loaded) : loaded_(loaded) {}
  ~PythonStep() override {
    if (rank_ == nullptr) return;
    py::gil_scoped_acquire gil;
    handle_->close();
    Py_DECREF(rank_);
    // The thread state kept since prepare goes with this scope, on the thread that made it.
    if (kept_thread_ == std::this_thread::get_id()) gil.dec_ref();
  }
  PythonStep(const PythonStep&) = delete;
  PythonStep& operator=(const PythonStep&) = delete;

  void prepare(harness::StepContext& context) override {
    handle_ = std::make_shared<RankHandle>(context);
    py::gil_scoped_acquire gil;
    if (loaded_.keeps_thread_state) {
      gil.inc_ref();
      kept_thread_ = std::this_thread::get_id();
    }
    Call call(*handle_);
    try {
      rank_ = Interpreter::get().runtime().attr("bind")(py::cast(handle_)).release().ptr();
    } catch (py::error_already_set& error) {
      const auto [type, message] = describe(error, loaded_.file);
      throw std::runtime_error(fmt::format("binding the Python step failed: {}: {}", type, message));
    }
  }

  void train_step(harness::StepContext& context) override {
    std::optional<double> loss_to_log, grad_norm;
    {
      py::gil_scoped_acquire gil;
      try {
        py::object result;
        {
          Call call(*handle_);
          const auto watchdog = step_watchdog(*handle_, context.rank());
          result = Interpreter::get().runtime().attr("run_step")(py::handle(loaded_.function),
                                                                 py::handle(rank_));
        }
        std::tie(loss_to_log, grad_norm) =
            result.cast<std::pair<std::optional<double>, std::optional<double>>>();
      } catch (py::error_already_set& error) {
        handle_->rethrow_pending();
        rethrow_step_error(error, loaded_);
      }
      handle_->rethrow_pending();
    }
    if (loss_to_log) context.log_loss(*loss_to_log);
    if (grad_norm) context.report_grad_norm(*grad_norm);
  }

 private:
  const LoadedStep& loaded_;
  std::shared_ptr<RankHandle> handle_;  // shared with Python, which may outlive the run
  PyObject* rank_ = nullptr;
  std::thread::id kept_thread_;  // where prepare kept its thread state (keeps_thread_state)
};

const LoadedStep& load(const StepSource& source) {
  static std::mutex mutex;
  // Never destroyed, like the steps it holds (their Python objects outlive static
  // destruction): at exit the steps stay reachable instead of reading as leaked once the map
  // is gone (LeakSanitizer reported them).
  static auto& loaded = *new std::map<std::pair<std::string, std::string>, LoadedStep*>();
  std::lock_guard lock(mutex);
  const auto key = std::make_pair(source.file, source.function);
  if (auto found = loaded.find(key); found != loaded.end()) return *found->second;
  if (auto why = scenarios::why_unreadable(source.file)) {
    throw InvalidInput(fmt::format("Python step '{}' {}", source.file, *why));
  }
  Interpreter& interpreter = Interpreter::get();
  py::gil_scoped_acquire gil;
  py::module_ runtime = interpreter.runtime();
  auto* step = new LoadedStep{source.file};
  try {
    const std::string module_name = detail::module_name_for("step", source.file);
    py::object function;
    {
      const auto watchdog = loading_watchdog(fmt::format("Python step '{}' did not load", source.file));
      try {
        function = runtime.attr("load_step")(source.file, source.function, module_name);
      } catch (py::error_already_set&) {
        if (watchdog->expired()) {
          throw InvalidInput(fmt::format("Python step '{}' did not load within {} ms (--timeout): "
                                         "its import hangs or takes longer",
                                         source.file, step_timeout_ms.load()));
        }
        throw;
      }
    }
    // The file's own module: a step imported from another file keeps that file's
    // __module__, whose cannot_run speaks for the other step, not this one.
    py::object module = py::module_::import("sys").attr("modules")[py::str(module_name)];
    if (py::hasattr(module, "cannot_run")) {
      step->cannot_run = py::object(module.attr("cannot_run")).release().ptr();
    }
    step->function = function.release().ptr();
  } catch (py::error_already_set& error) {
    delete step;
    const auto [type, message] = describe(error, source.file);
    throw InvalidInput(fmt::format("Python step '{}' does not load: {}: {}", source.file, type, message));
  } catch (...) {
    delete step;
    throw;
  }
  loaded.emplace(key, step);
  return *step;
}

// The module's cannot_run(scenario), if it defines one. An error in it is an input error:
// the step cannot say what it handles.
std::optional<std::string> ask_cannot_run(const LoadedStep& step, const scenarios::Scenario& s) {
  if (step.cannot_run == nullptr) return std::nullopt;
  py::gil_scoped_acquire gil;
  const auto watchdog = loading_watchdog(fmt::format("Python step '{}': cannot_run did not answer on scenario '{}'", step.file, s.name));
  try {
    py::object why;
    try {
      why = py::handle(step.cannot_run)(scenario_facts(s));
    } catch (py::error_already_set&) {
      if (watchdog->expired()) {
        throw InvalidInput(fmt::format("Python step '{}': cannot_run did not answer on scenario "
                                       "'{}' within {} ms (--timeout)",
                                       step.file, s.name, step_timeout_ms.load()));
      }
      throw;
    }
    if (why.is_none()) return std::nullopt;
    if (py::isinstance<py::str>(why)) {
      return Interpreter::get().runtime().attr("safe_text")(why).cast<std::string>();
    }
    throw InvalidInput(fmt::format("Python step '{}': cannot_run must return None or a string "
                                   "(the reason), it returned {}",
                                   step.file, py::str(py::type::handle_of(why).attr("__name__")).cast<std::string>()));
  } catch (py::error_already_set& error) {
    const auto [type, message] = describe(error, step.file);
    throw InvalidInput(fmt::format("Python step '{}': cannot_run raised on scenario '{}': {}: {}",
                                   step.file, s.name, type, message));
  }
}

// What every Python-side variant (a step file, a recipe) runs and skips, and the findings
// it expects when it transcribes another variant.
void bind_step(harness::VariantSpec& spec, const LoadedStep& loaded, const std::string& findings_of) {
  spec.make = [&loaded] { return std::make_unique<PythonStep>(loaded); };
  spec.cannot_run = [&loaded](const scenarios::Scenario& s) { return ask_cannot_run(loaded, s); };
  if (!findings_of.empty()) {
    const harness::VariantSpec& original = harness::find_variant(findings_of);
    spec.findings = [original](const scenarios::Scenario& s, const harness::ContractFacts& facts) {
      return harness::documented_finding(original, s, facts);
    };
  }
}

}  // namespace

StepSource parse_step_source(const std::string& text) {
  StepSource out;
  // A colon after the last path separator splits FILE from FUNCTION.
  const auto slash = text.find_last_of('/');
  const auto colon = text.find(':', slash == std::string::npos ? 0 : slash);
  out.file = text.substr(0, colon);
  if (colon != std::string::npos) out.function = text.substr(colon + 1);
  if (out.file.empty() || out.function.empty()) {
    throw InvalidInput(fmt::format("Python step '{}': expected FILE.py or FILE.py:FUNCTION", text));
  }
  return out;
}

void set_step_timeout(std::chrono::milliseconds timeout) { detail::step_timeout_ms = timeout.count(); }

namespace {

// torch.distributed makes the group (gradnorm_torch.make_gloo_group); the harness gets its
// c10d::Backend through torch's own pybind11 bindings of Store and Backend.
c10::intrusive_ptr<c10d::Backend> make_gloo_group(const harness::GlooGroupRequest& request) {
  Interpreter& interpreter = Interpreter::get();
  py::gil_scoped_acquire gil;
  try {
    py::object backend = interpreter.runtime().attr("make_gloo_group")(
        py::cast(request.store), request.rank, request.size,
        static_cast<long long>(request.timeout.count()), request.world);
    return backend.cast<c10::intrusive_ptr<c10d::Backend>>();
  } catch (py::error_already_set& error) {
    throw std::runtime_error(harness::first_line(error.what()));
  } catch (const py::cast_error& error) {
    throw std::runtime_error(fmt::format("torch.distributed's Gloo group did not reach C++ as a "
                                         "c10d::Backend: {}",
                                         error.what()));
  }
}

}  // namespace

void install_gloo_groups() { harness::set_gloo_group_maker(&make_gloo_group); }

void hold_interpreter_until_exit() {
  // torch's DTensor dispatch keeps Python objects in thread-local caches (libtorch_python's
  // NativeOpSchema table), destroyed by the exiting thread's TLS destructors, which run
  // before any atexit handler: with the GIL released they abort the process ("PyThreadState_Get:
  // the function must be called with the GIL held"). Measured after fully_shard on a rank
  // process. Taken here and never given back, so those destructors find it held.
  // Attached to a running interpreter (python -m gradnorm), its caller holds the thread's
  // state and ends the process (python/gradnorm/__main__.py).
  if (detail::Interpreter::started() && !attached_to_running_interpreter()) PyGILState_Ensure();
}

namespace {
PyGILState_STATE fork_gil;  // taken by before_fork, given back after it in parent and child
}  // namespace

std::vector<std::string> python_threads() {
  std::vector<std::string> names;
  if (!detail::Interpreter::started()) return names;
  py::gil_scoped_acquire gil;
  try {
    py::module_ threading = py::module_::import("threading");
    py::object main = threading.attr("main_thread")();
    for (py::handle thread : threading.attr("enumerate")()) {
      if (!thread.is(main)) names.push_back(py::str(thread.attr("name")).cast<std::string>());
    }
  } catch (py::error_already_set&) {
  }
  return names;
}

void plan_for_rank_processes() {
  if (!detail::Interpreter::started()) return;
  py::gil_scoped_acquire gil;
  detail::Interpreter::get().runtime().attr("plan_for_rank_processes")();
}

void before_fork() {
  if (!detail::Interpreter::started()) return;
  fork_gil = PyGILState_Ensure();
  // What every rank would otherwise do first, done once here (neither starts a thread:
  // measured, one thread before and after): torch imports torch._dynamo (822 modules, 1.1 s
  // on a 2-core machine) at an optimizer's first step or clip_grad_norm_'s first call, and
  // ATen's first kernel reads the CPU's features (cpuinfo, 28 ms a rank).
  static const bool warmed = [] {
    (void)at::zeros({1});
    if (PyObject* module = PyImport_ImportModule("torch._dynamo")) {
      Py_DECREF(module);
      return true;
    }
    PyErr_Clear();
    return false;
  }();
  (void)warmed;
  // Python's collector would go through every object the rank inherited at each collection
  // (a gc.collect() in a forked rank took 0.23 s after torch and transformers, and wrote
  // every object's header, copying its pages from the parent: accelerate's free_memory runs
  // one at the end of every Trainer run). Frozen, they are left alone; the rank's own are not.
  if (PyObject* gc = PyImport_ImportModule("gc")) {
    if (PyObject* done = PyObject_CallMethod(gc, "freeze", nullptr)) {
      Py_DECREF(done);
    } else {
      PyErr_Clear();
    }
    Py_DECREF(gc);
  } else {
    PyErr_Clear();
  }
  // What Python buffered for standard output or error is written once, by this process.
  for (const char* name : {"stdout", "stderr"}) {
    if (PyObject* stream = PySys_GetObject(name); stream != nullptr && stream != Py_None) {
      if (PyObject* done = PyObject_CallMethod(stream, "flush", nullptr)) {
        Py_DECREF(done);
      } else {
        PyErr_Clear();
      }
    }
  }
  PyOS_BeforeFork();
}

void after_fork_parent() {
  if (!detail::Interpreter::started()) return;
  PyOS_AfterFork_Parent();
  PyGILState_Release(fork_gil);
}

void after_fork_child(const std::vector<std::string>& environment) {
  if (!detail::Interpreter::started()) return;
  PyOS_AfterFork_Child();
  try {
    py::dict variables;
    for (const std::string& entry : environment) {
      const std::size_t equals = entry.find('=');
      if (equals != std::string::npos) variables[py::str(entry.substr(0, equals))] = py::str(entry.substr(equals + 1));
    }
    detail::Interpreter::get().runtime().attr("become_harness")(variables);
  } catch (py::error_already_set& error) {
    // The rank would run with the supervisor's os.environ: it must not run at all.
    std::fprintf(stderr, "gradnorm: a warm rank process could not take its environment: %s\n", error.what());
    std::fflush(stderr);
    std::_Exit(70);
  }
  PyGILState_Release(fork_gil);
}

harness::Role parse_python_role(const std::string& text) {
  if (text == "candidate") return harness::Role::candidate;
  if (text == "reference") return harness::Role::reference;
  throw InvalidInput(fmt::format("Python step role '{}': expected candidate or reference (a "
                                 "negative control needs a bug_visible rule, which only C++ "
                                 "steps can give)",
                                 text));
}

harness::VariantSpec make_python_variant(const PythonVariant& variant) {
  if (variant.role == harness::Role::negative_control) {
    throw InvalidInput(fmt::format("Python step '{}': a negative control needs a bug_visible "
                                   "rule, which only C++ steps can give",
                                   variant.source.file));
  }
  const LoadedStep& loaded = load(variant.source);
  harness::VariantSpec spec;
  spec.name = variant.name.empty()
                  ? "py/" + std::filesystem::path(variant.source.file).stem().string()
                  : variant.name;
  spec.role = variant.role;
  spec.reference = variant.role == harness::Role::reference ? spec.name : variant.reference;
  spec.summary = fmt::format("Python step {}:{}", variant.source.file, variant.source.function);
  bind_step(spec, loaded, variant.findings_of);
  return spec;
}

namespace {

const LoadedStep& load_recipe(const RecipeVariant& variant, std::string& name,
                              harness::Objective& objective, std::string& what_runs) {
  const auto colon = variant.spec.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == variant.spec.size()) {
    throw InvalidInput(fmt::format("--recipe '{}': expected FRAMEWORK:NAME or FRAMEWORK:PATH.py "
                                   "(e.g. torchtune:full_finetune_single_device)",
                                   variant.spec));
  }
  const std::string framework = variant.spec.substr(0, colon);
  const std::string target = variant.spec.substr(colon + 1);
  // A file (torchtune:PATH.py, transformers:PATH.py:NAME) that exists is read as every input
  // path is: a folder, FIFO, device or link loop is named as one (each read as "no such
  // file"). One that does not exist is the adapter's to name, after the target's shape.
  if (const auto py = target.find(".py"); py != std::string::npos &&
                                          (py + 3 == target.size() || target[py + 3] == ':')) {
    const std::string file = target.substr(0, py + 3);
    struct stat entry {};
    const bool there = ::lstat(file.c_str(), &entry) == 0;
    if (auto why = there ? scenarios::why_unreadable(file) : std::nullopt) {
      throw InvalidInput(fmt::format("--recipe {}: '{}' {}", variant.spec, file, *why));
    }
  }
  Interpreter& interpreter = Interpreter::get();
  py::gil_scoped_acquire gil;
  auto* step = new LoadedStep{};
  step->keeps_thread_state = true;
  try {
    py::tuple loaded;
    {
      // The recipe's module (a user's file, or the framework's) imports here.
      const auto watchdog = loading_watchdog(fmt::format("--recipe {} did not load", variant.spec));
      try {
        loaded = interpreter.recipes().attr("load_recipe")(
            framework, target, variant.args, detail::module_name_for("recipe", target));
      } catch (py::error_already_set&) {
        if (watchdog->expired()) {
          delete step;
          throw InvalidInput(fmt::format("--recipe {} did not load within {} ms (--timeout): its "
                                         "import hangs or takes longer",
                                         variant.spec, step_timeout_ms.load()));
        }
        throw;
      }
    }
    step->file = loaded[0].cast<std::string>();
    step->function = py::object(loaded[1]).release().ptr();
    step->cannot_run = py::object(loaded[2]).release().ptr();
    objective = loaded[3].cast<std::string>() == "knowledge_distillation"
                    ? harness::Objective::knowledge_distillation
                    : harness::Objective::scenario_loss;
    what_runs = loaded[4].cast<std::string>();
  } catch (py::error_already_set& error) {
    delete step;
    const auto [type, message] = describe(error, target);
    throw InvalidInput(fmt::format("--recipe {}: {}: {}", variant.spec, type, message));
  }
  // A Trainer subclass in a file (transformers:PATH.py:NAME, trl:PATH.py:NAME) is named
  // FILE-STEM.NAME.
  const auto py_colon = target.find(".py:");
  const std::string stem =
      py_colon == std::string::npos
          ? std::filesystem::path(target).stem().string()
          : std::filesystem::path(target.substr(0, py_colon + 3)).stem().string() + "." +
                target.substr(py_colon + 4);
  name = variant.name.empty() ? framework + "/" + stem : variant.name;
  // Kept for the life of the process, as load() keeps steps: in a list that is never
  // destroyed, so the step stays reachable after the registry's variants are gone at exit
  // (LeakSanitizer reported it from every --recipe run). Under the GIL, taken above.
  static auto& kept = *new std::vector<const LoadedStep*>();
  kept.push_back(step);
  return *step;
}

}  // namespace

namespace {

// What the command line needs to know of a framework before its adapter is loaded: the model a
// recipe run gives scenarios whose model is built in, and the framework argument that sets
// the clip, if the framework has one a --recipe-arg may set.
struct FrameworkFacts {
  std::string_view prefix;  // "transformers:"
  const char* default_model;  // "FILE:FUNCTION" under examples_dir()
  std::string_view clip_argument;
  // Whether a recipe named *lora* gets the model function's _lora twin (FUNCTION_lora).
  bool lora_twin = false;
};

constexpr FrameworkFacts kFrameworks[] = {
    {"transformers:", "transformers/tiny_llama.py:hf_tiny_llama",
     "max_grad_norm"},
    {"trl:", "transformers/tiny_llama.py:hf_tiny_llama",
     "max_grad_norm"},
    {"lightning:", "python/tiny_transformer.py:tiny_transformer",
     "gradient_clip_val"},
    {"fabric:", "python/tiny_transformer.py:tiny_transformer", ""},
    {"accelerate:", "python/tiny_transformer.py:tiny_transformer", ""},
    {"deepspeed:", "python/tiny_transformer.py:tiny_transformer",
     "gradient_clipping"},
    {"litgpt:", "litgpt/tiny_gpt.py:tiny_gpt", "", true},
};

const FrameworkFacts* facts_of(std::string_view recipe) {
  for (const FrameworkFacts& facts : kFrameworks) {
    if (recipe.rfind(facts.prefix, 0) == 0) return &facts;
  }
  return nullptr;
}

}  // namespace

std::string_view recipe_clip_argument(std::string_view recipe) {
  const FrameworkFacts* facts = facts_of(recipe);
  return facts == nullptr ? std::string_view() : facts->clip_argument;
}

std::string default_recipe_model(std::string_view recipe) {
  if (const FrameworkFacts* facts = facts_of(recipe)) {
    std::string spec = "python:" + examples_dir() + "/" + facts->default_model;
    if (facts->lora_twin && recipe.find("lora") != std::string_view::npos) spec += "_lora";
    return spec;
  }
  std::string spec = "python:" + examples_dir() + "/torchtune/tiny_llama.py:tiny_llama";
  // A LoRA recipe trains adapters, and so do torchtune's distilling recipes (their student
  // is a LoRA model): the default model is then the same decoder with LoRA on q and v.
  if (recipe.find("lora") != std::string_view::npos ||
      recipe.find("knowledge_distillation") != std::string_view::npos) {
    spec += "_lora";
  }
  return spec;
}

harness::VariantSpec make_recipe_variant(const RecipeVariant& variant) {
  std::string name;
  harness::Objective objective = harness::Objective::scenario_loss;
  std::string what_runs;
  const LoadedStep& loaded = load_recipe(variant, name, objective, what_runs);
  harness::VariantSpec spec;
  spec.name = name;
  spec.objective = objective;
  spec.role = harness::Role::candidate;
  spec.reference = variant.reference;
  spec.summary = fmt::format("{}, unmodified ({})", what_runs, loaded.file);
  spec.runs = what_runs;
  bind_step(spec, loaded, variant.findings_of);
  return spec;
}

void register_python_step(const PythonVariant& variant) {
  harness::register_variant(make_python_variant(variant));
}

}  // namespace gradnorm::python
