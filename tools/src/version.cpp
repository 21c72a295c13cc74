// `gradnorm --version`: gradnorm's own version, the LibTorch it was built against,
// and the build's options (Python steps, the NCCL backend, the build type, sanitizers).
#include "version.hpp"

#include <fmt/format.h>
#include <torch/version.h>

#include "gradnorm/harness/transport.hpp"
#include "gradnorm/python/python_step.hpp"

namespace gradnorm::tools {

std::string version_text() {
  return fmt::format(
      "gradnorm {}\n"
      "torch {} (the LibTorch it was built against)\n"
      "Python steps: {}\n"
      "NCCL backend (--backend nccl): {}\n"
      "build: {}{}\n"
      "guide: README.md, then docs/",
      GRADNORM_VERSION, TORCH_VERSION, python::embedded_python_description(),
      harness::nccl_compiled_in() ? "compiled in"
                                  : "not compiled in (no CUDA toolkit headers, or GRADNORM_WITH_NCCL=OFF)",
      GRADNORM_BUILD_TYPE, GRADNORM_SANITIZED ? ", AddressSanitizer and UBSan" : "");
}

}  // namespace gradnorm::tools
