#include "interpreter.hpp"

#include <fmt/format.h>
#include <torch/version.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>
#include <mutex>
#include <thread>

#include "embedded_sources.hpp"
#include "watchdog.hpp"
#include "gradnorm/harness/runner.hpp"
#include "gradnorm/python/python_step.hpp"
#include "gradnorm/scenarios/files.hpp"
#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::python::detail {

using scenarios::InvalidInput;

namespace {
std::atomic<bool> started{false};
// Set by attach_to_running_interpreter: the process is a Python program (python -m gradnorm)
// and its interpreter is the one to use; what describes it for --version.
bool attached = false;
std::string attached_description;

// The examples' folder (default models of --recipe, bench --ranks): the source tree's, or
// the one the Python package ships (set_examples_dir).
std::string& examples_folder() {
  static std::string folder = GRADNORM_EXAMPLES_DIR;
  return folder;
}
}  // namespace

const std::string& python_executable() {
  static const std::string path = [] {
    if (attached) {
      py::gil_scoped_acquire gil;
      return py::module_::import("sys").attr("executable").cast<std::string>();
    }
    const char* chosen = std::getenv("GRADNORM_PYTHON");
    return std::string(chosen != nullptr && *chosen != '\0' ? chosen : GRADNORM_DEFAULT_PYTHON);
  }();
  return path;
}

bool Interpreter::started() { return detail::started.load(); }

namespace {

// What `executable -c script` printed on standard output and error, and its exit status (-1
// when it could not be run or did not finish within `bound`).
struct Ran {
  int status = -1;
  std::string out, err;
};

Ran run_briefly(const std::string& executable, const char* script, std::chrono::milliseconds bound) {
  Ran ran;
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return ran;
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return ran;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  std::string program = executable, dash_c = "-c", code = script;
  char* argv[] = {program.data(), dash_c.data(), code.data(), nullptr};
  pid_t child = -1;
  const int spawned = posix_spawn(&child, executable.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  ::close(err[1]);
  if (spawned != 0) {
    ran.err = std::strerror(spawned);
    ::close(out[0]);
    ::close(err[0]);
    return ran;
  }
  const auto deadline = std::chrono::steady_clock::now() + bound;
  for (int fd : {out[0], err[0]}) ::fcntl(fd, F_SETFL, O_NONBLOCK);
  char buffer[4096];
  int raw = 0;
  bool exited = false;
  while (std::chrono::steady_clock::now() < deadline) {
    for (auto [fd, text] : {std::pair{out[0], &ran.out}, std::pair{err[0], &ran.err}}) {
      for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0 && text->size() < 65536;) text->append(buffer, static_cast<std::size_t>(n));
    }
    if (exited) break;
    exited = ::waitpid(child, &raw, WNOHANG) == child;
    if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (!exited) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &raw, 0);
  } else if (WIFEXITED(raw)) {
    ran.status = WEXITSTATUS(raw);
  }
  ::close(out[0]);
  ::close(err[0]);
  return ran;
}

// GRADNORM_PYTHON names the environment whose torch the embedded interpreter imports: checked
// from outside, in a process of its own, before this process loads anything of it. A folder,
// /bin/sh, another CPython (3.12, 2.7) or another torch (Debian's 1.13, whose _C was loaded
// beside this build's LibTorch 2.13) ended the process with SIGBUS and no message.
void check_chosen_environment(const std::string& executable) {
  const std::string named = "GRADNORM_PYTHON=" + executable;
  const std::string want_python = fmt::format("{}.{}", PY_MAJOR_VERSION, PY_MINOR_VERSION);
  const std::string want_torch = fmt::format("{}.{}.{}", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);
  if (auto why = scenarios::why_unreadable(executable)) throw std::runtime_error(fmt::format("{} {}", named, *why));
  if (::access(executable.c_str(), X_OK) != 0) throw std::runtime_error(named + " is not executable");
  const Ran ran = run_briefly(executable,
                              "import sys, importlib.util as u\n"
                              "s = u.find_spec('torch')\n"
                              "print('gradnorm-check %d.%d' % sys.version_info[:2])\n"
                              "print('gradnorm-check ' + (s.origin or '' if s else ''))\n",
                              std::chrono::milliseconds(std::max<long>(step_timeout_ms.load(), 10'000)));
  std::vector<std::string> lines;
  for (std::size_t at = 0; (at = ran.out.find("gradnorm-check ", at)) != std::string::npos;) {
    const std::size_t end = ran.out.find('\n', at);
    lines.push_back(ran.out.substr(at + 15, end == std::string::npos ? std::string::npos : end - at - 15));
    at = end == std::string::npos ? ran.out.size() : end;
  }
  if (ran.status != 0 || lines.size() != 2) {
    // The last line it said: a traceback's ends with the exception.
    std::string said = ran.err.empty() ? ran.out : ran.err;
    while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
    said = said.substr(said.rfind('\n') == std::string::npos ? 0 : said.rfind('\n') + 1);
    throw std::runtime_error(fmt::format("{} is not a Python {} this build can use: it did not "
                                         "answer a version check{}",
                                         named, want_python, said.empty() ? "" : " (" + said + ")"));
  }
  if (lines[0] != want_python) {
    throw std::runtime_error(fmt::format("{} is Python {}; this build embeds Python {} (its "
                                         "torch's extension modules are built for one)",
                                         named, lines[0], want_python));
  }
  if (lines[1].empty()) {
    throw std::runtime_error(fmt::format("{} has no torch: install torch=={} there "
                                         "(scripts/install-deps.sh makes such an environment)",
                                         named, want_torch));
  }
  std::ifstream version_file(std::filesystem::path(lines[1]).parent_path() / "version.py");
  std::string found;
  for (std::string line; std::getline(version_file, line);) {
    if (line.rfind("__version__", 0) != 0) continue;
    const auto quote = line.find_first_of("'\"");
    const auto close = quote == std::string::npos ? quote : line.find(line[quote], quote + 1);
    if (close != std::string::npos) found = line.substr(quote + 1, close - quote - 1);
  }
  if (found.rfind(want_torch, 0) != 0 || (found.size() > want_torch.size() && found[want_torch.size()] != '+')) {
    throw std::runtime_error(fmt::format("{} has torch {} (at {}); this build is compiled against "
                                         "torch {}, whose LibTorch it holds: install torch=={} "
                                         "there, or build gradnorm against that environment",
                                         named, found.empty() ? "of an unknown version" : found,
                                         std::filesystem::path(lines[1]).parent_path().string(),
                                         want_torch, want_torch));
  }
}

}  // namespace

namespace {

// Ends the process (exit 2, naming the environment) if the interpreter has not started by the
// deadline: nothing can interrupt CPython while it initialises.
class StartDeadline {
 public:
  explicit StartDeadline(std::string executable)
      : executable_(std::move(executable)),
        timeout_(std::chrono::milliseconds(step_timeout_ms.load())),
        deadline_(std::chrono::steady_clock::now() + timeout_) {
    thread_ = std::thread([this] { watch(); });
  }
  ~StartDeadline() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  StartDeadline(const StartDeadline&) = delete;
  StartDeadline& operator=(const StartDeadline&) = delete;

  // The next phase ("importing torch") gets the timeout and `more`.
  void extend(std::chrono::milliseconds more, const char* phase) {
    {
      std::lock_guard lock(mutex_);
      phase_ = phase;
      allowed_ = timeout_ + more;
      deadline_ = std::chrono::steady_clock::now() + allowed_;
    }
    cv_.notify_all();
  }

 private:
  void watch() {
    std::unique_lock lock(mutex_);
    while (!done_) {
      if (cv_.wait_until(lock, deadline_, [this] { return done_; })) return;
      if (std::chrono::steady_clock::now() < deadline_) continue;  // extended meanwhile
      std::fprintf(stderr,
                   "gradnorm: the Python environment %s did not start within %lld ms (%s): "
                   "%s hangs (a sitecustomize, usercustomize or .pth file on its path, or a "
                   "module it imports?)\n",
                   executable_.c_str(), static_cast<long long>(allowed_.count()),
                   phase_ == nullptr ? "--timeout" : "--timeout and 60 s for torch's import",
                   phase_ == nullptr ? "its start-up" : phase_);
      std::fflush(stderr);
      std::_Exit(2);
    }
  }

  std::string executable_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds allowed_ = timeout_;
  std::chrono::steady_clock::time_point deadline_;
  const char* phase_ = nullptr;  // null: CPython's own start-up
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace

Interpreter& Interpreter::get() {
  static Interpreter* instance = nullptr;
  static std::string failure;
  static std::once_flag once;
  std::call_once(once, [] {
    try {
      instance = new Interpreter();
      detail::started = true;
    } catch (const std::exception& error) {
      failure = error.what();
    }
  });
  if (instance == nullptr) throw InvalidInput("cannot start the embedded Python: " + failure);
  return *instance;
}

Interpreter::Interpreter() {
  if (attached) {
    // python -m gradnorm: CPython runs already, with torch imported and its own environment
    // variables set before that (python/gradnorm/__main__.py); this thread holds no GIL.
    py::gil_scoped_acquire gil;
    set_up();
    return;
  }
  // The environment's Python (docs/design.md §5): told that its executable is the venv's
  // bin/python, CPython reads the pyvenv.cfg beside it and takes that environment's
  // site-packages, where its torch is. No signal handlers: the harness and its supervisor
  // own SIGINT and SIGTERM.
  // NumPy's OpenBLAS starts a server thread at import (torch imports NumPy) unless told to
  // use one thread: a process that forks warm rank processes must have none (docs/ranks.md).
  // torch's own kernels do not use it.
  setenv("OPENBLAS_NUM_THREADS", "1", /*overwrite=*/0);
  // pyarrow (which transformers imports, through datasets) starts jemalloc's background
  // purging thread at import unless its jemalloc is told otherwise; it then returns freed
  // pages on allocation instead. Numbers are not touched.
  setenv("JE_ARROW_MALLOC_CONF", "background_thread:false", /*overwrite=*/0);
  // (A rank of gradnorm's own supervisor is started by a process that checked it already.)
  if (const char* chosen = std::getenv("GRADNORM_PYTHON");
      chosen != nullptr && *chosen != '\0' && std::getenv("GRADNORM_STATUS_DIR") == nullptr) {
    check_chosen_environment(python_executable());
  }
  PyConfig config;
  PyConfig_InitPythonConfig(&config);
  config.parse_argv = 0;
  config.install_signal_handlers = 0;
  const std::string& executable = python_executable();
  if (PyStatus status = PyConfig_SetBytesString(&config, &config.executable, executable.c_str());
      PyStatus_Exception(status)) {
    PyConfig_Clear(&config);
    throw std::runtime_error(fmt::format("the interpreter path {} cannot be used", executable));
  }
  // Start-up runs what the environment adds (site, sitecustomize, .pth files): bounded by
  // --timeout. torch's import, which takes 1-3 s on two busy cores, gets a minute more, so a
  // slow machine does not read as a hang.
  StartDeadline deadline(executable);
  py::initialize_interpreter(&config, 0, nullptr, /*add_program_dir_to_path=*/false);
  deadline.extend(std::chrono::seconds(60), "importing torch");
  set_up();
  PyEval_SaveThread();
}

void Interpreter::set_up() {
  try {
    py::module_::import("torch");  // before any tensor is wrapped
    py::module_ sys = py::module_::import("sys");
    // _gradnorm_native (RankHandle), made here rather than by an inittab entry: an extension
    // module cannot add one to a running interpreter.
    static PyModuleDef native_definition{};
    py::module_ native = py::module_::create_extension_module("_gradnorm_native", nullptr, &native_definition);
    define_native_module(native);
    sys.attr("modules")["_gradnorm_native"] = native;
    py::object module = py::module_::import("types").attr("ModuleType")("gradnorm_torch");
    module.attr("__file__") = "gradnorm_torch.py";
    sys.attr("modules")["gradnorm_torch"] = module;
    // Compiled under its own name, so tracebacks through it read gradnorm_torch.py.
    py::module_ builtins = py::module_::import("builtins");
    builtins.attr("exec")(
        builtins.attr("compile")(detail::kEmbeddedModuleSource, "gradnorm_torch.py", "exec"),
        module.attr("__dict__"));
    module.attr("embed")();  // guards that hold inside gradnorm only
    runtime_ = module.release().ptr();
    py::register_exception_translator([](std::exception_ptr raised) {
      try {
        if (raised) std::rethrow_exception(raised);
      } catch (const Interrupted&) {
        py::object interrupt = Interpreter::get().runtime().attr("HarnessInterrupt");
        PyErr_SetString(interrupt.ptr(), "the harness stopped this step");
      } catch (const TorchCallError& error) {
        py::object torch_error = Interpreter::get().runtime().attr("TorchError");
        PyErr_SetString(torch_error.ptr(), error.what());
      }
    });
  } catch (const py::error_already_set& error) {
    throw InvalidInput(fmt::format("importing torch and gradnorm_torch failed: {} (the "
                                   "environment is {}: is torch installed there? "
                                   "scripts/install-deps.sh makes it; GRADNORM_PYTHON "
                                   "names another)",
                                   harness::first_line(error.what()), python_executable()));
  }
}

namespace {

// A module compiled into gradnorm, made importable as NAME (in sys.modules) and run.
py::object embedded_module(const char* name, const char* source) {
  py::module_ sys = py::module_::import("sys");
  py::object module = py::module_::import("types").attr("ModuleType")(name);
  const std::string file = std::string(name) + ".py";
  module.attr("__file__") = file;
  sys.attr("modules")[name] = module;
  py::module_ builtins = py::module_::import("builtins");
  try {
    builtins.attr("exec")(builtins.attr("compile")(source, file, "exec"), module.attr("__dict__"));
  } catch (py::error_already_set&) {
    sys.attr("modules").attr("pop")(name);
    throw;
  }
  return module;
}

}  // namespace

py::module_ Interpreter::recipes() {
  // Called with the GIL held, which also serialises the first call.
  if (recipes_ == nullptr) {
    py::object module = embedded_module("gradnorm_frameworks", kEmbeddedFrameworksSource);
    py::dict adapters;
    for (std::size_t i = 0; i < kEmbeddedAdapterCount; ++i) {
      adapters[kEmbeddedAdapters[i].module] = kEmbeddedAdapters[i].source;
    }
    module.attr("load_adapters")(adapters);
    recipes_ = module.release().ptr();
  }
  return py::reinterpret_borrow<py::module_>(recipes_);
}

std::string module_name_for(const std::string& kind, const std::string& file) {
  static std::mutex mutex;
  static int counter = 0;
  std::lock_guard lock(mutex);
  std::string stem = std::filesystem::path(file).stem().string();
  for (char& c : stem) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return fmt::format("gradnorm_{}_{}_{}", kind, counter++, stem);
}

py::object exception_of(py::error_already_set& error) {
  py::object value = error.value();
  if (error.trace()) PyException_SetTraceback(value.ptr(), error.trace().ptr());
  return value;
}

std::pair<std::string, std::string> describe(py::error_already_set& error, const std::string& file,
                                             PyObject* function) {
  try {
    return Interpreter::get().runtime().attr("describe")(
        exception_of(error), file, function ? py::handle(function) : py::handle(Py_None))
        .cast<std::pair<std::string, std::string>>();
  } catch (const std::exception& inner) {
    return {"Exception", fmt::format("an exception gradnorm could not describe ({})",
                                     harness::first_line(inner.what()))};
  }
}

}  // namespace gradnorm::python::detail

void gradnorm::python::attach_to_running_interpreter(std::string description) {
  detail::attached = true;
  detail::attached_description = std::move(description);
}

bool gradnorm::python::attached_to_running_interpreter() { return detail::attached; }

void gradnorm::python::set_examples_dir(std::string folder) { detail::examples_folder() = std::move(folder); }

const std::string& gradnorm::python::examples_dir() { return detail::examples_folder(); }

std::string gradnorm::python::embedded_python_description() {
  if (detail::attached) return detail::attached_description;
  return std::string("CPython ") + PY_VERSION + " embedded; its environment: " +
         detail::python_executable() +
         (std::getenv("GRADNORM_PYTHON") != nullptr ? " (from GRADNORM_PYTHON)" : " (the build's; GRADNORM_PYTHON overrides)");
}
