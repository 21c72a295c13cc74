#pragma once
// The Python sources compiled into gradnorm (python/CMakeLists.txt generates their definitions
// from the files): the step runtime, the frameworks' shared machinery, and one adapter per
// framework, each imported under its module name.

#include <cstddef>

namespace gradnorm::python::detail {

extern const char* const kEmbeddedModuleSource;      // python/gradnorm_torch.py
extern const char* const kEmbeddedFrameworksSource;  // python/gradnorm_frameworks.py

struct EmbeddedAdapter {
  const char* module;  // "gradnorm_NAME", for python/adapters/NAME.py
  const char* source;
};
extern const EmbeddedAdapter kEmbeddedAdapters[];
extern const std::size_t kEmbeddedAdapterCount;

}  // namespace gradnorm::python::detail
