// gradnorm._native, the Python package's extension module (python/gradnorm): the gradnorm
// command line, fuzz aside (command_line.hpp says why), run inside the Python process that
// imported it. python/gradnorm/__main__.py is its one caller: the process is then gradnorm's
// (python -m gradnorm, the gradnorm console script), as the executable's is.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdio>
#include <string>
#include <vector>

#include "command_line.hpp"
#include "gradnorm/python/python_step.hpp"
#include "process_supervisor.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_native, m) {
  m.doc() = "gradnorm's command line, run in this interpreter (python -m gradnorm)";
  m.def(
      "run_command_line",
      [](std::vector<std::string> arguments, std::vector<std::string> self_command,
         std::string examples_dir, std::string description) {
        gradnorm::python::attach_to_running_interpreter(std::move(description));
        gradnorm::tools::set_self_command(std::move(self_command));
        if (!examples_dir.empty()) gradnorm::python::set_examples_dir(std::move(examples_dir));
        std::vector<char*> argv;
        for (std::string& argument : arguments) argv.push_back(argument.data());
        argv.push_back(nullptr);
        int code = 0;
        {
          // The harness takes the GIL where it calls Python, from any of its threads.
          py::gil_scoped_release release;
          code = gradnorm::tools::run_commands(static_cast<int>(arguments.size()), argv.data(), nullptr);
          std::fflush(nullptr);
        }
        return code;
      },
      py::arg("arguments"), py::arg("self_command"), py::arg("examples_dir"), py::arg("description"),
      "Runs gradnorm's command line (ARGUMENTS[0] is the program's name) and returns its exit "
      "status; once per process, which should then end with os._exit (python/gradnorm/__main__.py).");
  m.def("build_info", [] {
    py::dict info;
    info["torch"] = GRADNORM_TORCH_VERSION;
    info["cxx11_abi"] = static_cast<int>(_GLIBCXX_USE_CXX11_ABI);
    info["python"] = std::to_string(PY_MAJOR_VERSION) + "." + std::to_string(PY_MINOR_VERSION);
    return info;
  });
}
