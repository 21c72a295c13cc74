#pragma once
// The embedded interpreter shared by Python steps (python_step.cpp) and models from Python
// files (python_model.cpp): one per process, started on first use with the environment's
// torch, its GIL released between calls (docs/design.md §10).

// torch's pybind11 casters for at::Tensor (THPVariable_Wrap / THPVariable_Unpack).
#include <torch/csrc/utils/pybind.h>

#include <pybind11/embed.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace gradnorm::python::detail {

namespace py = pybind11;

// Raised into Python when a harness call failed for a reason the harness owns (another
// rank's step raised, a collective timed out); the step's own code cannot catch it
// (gradnorm_torch.HarnessInterrupt is a BaseException) and the harness rethrows the cause.
struct Interrupted {};

// A LibTorch error inside a harness call made from Python: gradnorm_torch.TorchError there.
struct TorchCallError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The Python environment whose torch this build was compiled against (GRADNORM_PYTHON at
// configure time), or the one the GRADNORM_PYTHON variable names at run time.
[[nodiscard]] const std::string& python_executable();

// The interpreter: started once (or the running one, attach_to_running_interpreter), never finalised (Python objects may outlive any order of
// static destruction), its GIL released between calls. Holds the gradnorm_torch module.
class Interpreter {
 public:
  // Starts it on first use; throws scenarios::InvalidInput when it cannot start.
  static Interpreter& get();
  // Whether get() has started it in this process.
  static bool started();

  // gradnorm_torch; call with the GIL held.
  [[nodiscard]] py::module_ runtime() const { return py::reinterpret_borrow<py::module_>(runtime_); }
  // gradnorm_frameworks (real framework code, --recipe) with every adapter registered,
  // compiled on first use; call with the GIL held.
  [[nodiscard]] py::module_ recipes();

 private:
  Interpreter();
  // torch, _gradnorm_native and gradnorm_torch (its guards on); with the GIL held.
  void set_up();
  PyObject* runtime_ = nullptr;
  PyObject* recipes_ = nullptr;
};

// A module name no other file loaded in this process has: "gradnorm_KIND_N_STEM" (KIND
// "step" or "model", STEM the file's stem with every non-alphanumeric character as '_').
[[nodiscard]] std::string module_name_for(const std::string& kind, const std::string& file);

// Defines the _gradnorm_native module (RankHandle: what Python holds of a rank); in
// python_step.cpp, registered by interpreter.cpp, so that any use of the interpreter links it.
void define_native_module(py::module_& m);

// The exception, with the whole traceback it was raised through (the value's own
// __traceback__ can stop short of the user's frame).
[[nodiscard]] py::object exception_of(py::error_already_set& error);

// (type name, "message (at FILE:LINE)"), never throwing: what cannot be described is
// named so. `function` (or null) is the step, cited when the traceback never reaches the
// user's file (an error in what the step returned).
[[nodiscard]] std::pair<std::string, std::string> describe(py::error_already_set& error,
                                                           const std::string& file,
                                                           PyObject* function = nullptr);

}  // namespace gradnorm::python::detail
