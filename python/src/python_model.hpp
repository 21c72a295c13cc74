#pragma once
// Models from Python files (python_model.cpp); the public part is
// python::install_python_models (gradnorm/python/python_step.hpp).

#include "interpreter.hpp"

#include "gradnorm/harness/model.hpp"

namespace gradnorm::python::detail {

// The torch.nn.Module behind a model = "python:FILE.py:FUNCTION" model (what a Python
// step's ctx.model is), or None for any other model. Call with the GIL held.
[[nodiscard]] py::object module_of(const harness::Model& model);

}  // namespace gradnorm::python::detail
