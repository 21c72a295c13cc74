# One torch for C++ and Python (docs/design.md §5): the Python environment GRADNORM_PYTHON
# names is the embedded interpreter, and the torch it imports is the LibTorch the C++ side
# builds against (torch.utils.cmake_prefix_path). The default is the project's own .venv,
# which scripts/install-deps.sh makes from requirements.txt (torch 2.13.0, CPU). Another
# torch >= 2.9 (a user's own, a CUDA build) is -DGRADNORM_PYTHON=/path/to/its/bin/python.
# Included by the top-level CMakeLists.txt and by the installed gradnormConfig.cmake; the
# three targets below are imported ones, so the installed package makes them anew from the
# torch it finds instead of carrying this machine's paths.
include_guard(GLOBAL)

if(NOT GRADNORM_PYTHON)
  if(DEFINED GRADNORM_DEFAULT_PYTHON)
    set(_gradnorm_python_default "${GRADNORM_DEFAULT_PYTHON}")
  else()
    set(_gradnorm_python_default "${CMAKE_CURRENT_LIST_DIR}/../.venv/bin/python")
  endif()
  cmake_path(NORMAL_PATH _gradnorm_python_default)
  set(GRADNORM_PYTHON "${_gradnorm_python_default}" CACHE FILEPATH
      "The Python whose torch gradnorm builds against and embeds (torch >= 2.9)")
endif()
if(NOT EXISTS "${GRADNORM_PYTHON}")
  message(FATAL_ERROR "gradnorm: GRADNORM_PYTHON=${GRADNORM_PYTHON} does not exist: run "
                      "scripts/install-deps.sh (it makes .venv from requirements.txt), or point "
                      "-DGRADNORM_PYTHON at a Python with torch >= 2.9")
endif()
execute_process(
  COMMAND "${GRADNORM_PYTHON}" -c
          "import torch, torch.utils; print(torch.__version__); print(torch.utils.cmake_prefix_path); print(int(torch.distributed.is_available() and torch.distributed.is_gloo_available()))"
  RESULT_VARIABLE _gradnorm_torch_rc OUTPUT_VARIABLE _gradnorm_torch_out ERROR_VARIABLE _gradnorm_torch_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _gradnorm_torch_rc EQUAL 0)
  message(FATAL_ERROR "gradnorm: ${GRADNORM_PYTHON} cannot import torch: ${_gradnorm_torch_err}")
endif()
string(REPLACE "\n" ";" _gradnorm_torch_out "${_gradnorm_torch_out}")
list(GET _gradnorm_torch_out 0 GRADNORM_TORCH_VERSION)
list(GET _gradnorm_torch_out 1 _gradnorm_torch_prefix)
list(GET _gradnorm_torch_out 2 _gradnorm_torch_gloo)
string(REGEX MATCH "^[0-9]+\\.[0-9]+" _gradnorm_torch_minor "${GRADNORM_TORCH_VERSION}")
if(_gradnorm_torch_minor VERSION_LESS 2.9)
  message(FATAL_ERROR "gradnorm: ${GRADNORM_PYTHON} has torch ${GRADNORM_TORCH_VERSION}; gradnorm "
                      "needs torch >= 2.9 (its wheel's c10d and pybind11 3 headers)")
endif()
if(NOT _gradnorm_torch_gloo)
  message(FATAL_ERROR "gradnorm: torch ${GRADNORM_TORCH_VERSION} in ${GRADNORM_PYTHON} was built "
                      "without torch.distributed's Gloo, which rank processes use")
endif()
list(PREPEND CMAKE_PREFIX_PATH "${_gradnorm_torch_prefix}")
find_package(Torch REQUIRED)
message(STATUS "gradnorm: torch ${GRADNORM_TORCH_VERSION} from ${GRADNORM_PYTHON} (${TORCH_INSTALL_PREFIX})")

# The embedded interpreter is that environment's Python (a venv's base interpreter holds the
# shared libpython; its site-packages are found at run time through the venv, see
# python/src/python_step.cpp). The Python package's extension module (python/gradnorm) needs
# only the headers: an interpreter without a shared libpython (a static build) builds the
# module and no executable.
set(Python3_EXECUTABLE "${GRADNORM_PYTHON}")
find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module OPTIONAL_COMPONENTS Development.Embed)

# libtorch_python holds the tensor <-> torch.Tensor caster; TorchConfig names no variable for
# it, so it is found beside libtorch.
find_library(GRADNORM_TORCH_PYTHON_LIBRARY torch_python HINTS "${TORCH_INSTALL_PREFIX}/lib"
             NO_DEFAULT_PATH REQUIRED)

if(NOT TARGET gradnorm_torch)
  # LibTorch as an interface target with SYSTEM includes and its C++ ABI setting.
  add_library(gradnorm_torch INTERFACE IMPORTED GLOBAL)
  target_include_directories(gradnorm_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
  target_link_libraries(gradnorm_torch INTERFACE ${TORCH_LIBRARIES})
  separate_arguments(_gradnorm_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(gradnorm_torch INTERFACE ${_gradnorm_torch_flags})
endif()
if(NOT TARGET gradnorm_fmt)
  # fmt: the one torch's wheel ships (include/fmt, header-only). c10d's own headers include
  # it, and torch's include folder comes before /usr/include, so Debian's libfmt-dev (fmt 9)
  # would compile against fmt 12's headers and fail to link: one fmt in the build, torch's.
  add_library(gradnorm_fmt INTERFACE IMPORTED GLOBAL)
  target_include_directories(gradnorm_fmt SYSTEM INTERFACE "${TORCH_INSTALL_PREFIX}/include")
  target_compile_definitions(gradnorm_fmt INTERFACE FMT_HEADER_ONLY)
endif()
if(NOT TARGET gradnorm_embed)
  # pybind11: the 3.x headers torch's wheel ships, the ones libtorch_python was built with, so
  # types cross between torch's bindings and gradnorm's (Debian's pybind11 2.10 would not).
  # libpython only where an executable links it: an extension module (MODULE_LIBRARY) takes
  # the symbols of the interpreter that loads it, and a second libpython beside a statically
  # linked one (Debian's /usr/bin/python3.11) would be a second interpreter.
  add_library(gradnorm_embed INTERFACE IMPORTED GLOBAL)
  target_link_libraries(gradnorm_embed INTERFACE gradnorm_torch Python3::Module
                        "${GRADNORM_TORCH_PYTHON_LIBRARY}")
  if(TARGET Python3::Python)
    target_link_libraries(gradnorm_embed INTERFACE
      "$<$<NOT:$<STREQUAL:$<TARGET_PROPERTY:TYPE>,MODULE_LIBRARY>>:Python3::Python>")
  endif()
endif()
