#pragma once
// `gradnorm --version` (tools/src/version.cpp).
#include <string>

namespace gradnorm::tools {

// Several lines, without the last newline: gradnorm's version, torch's, the build's options.
[[nodiscard]] std::string version_text();

}  // namespace gradnorm::tools
