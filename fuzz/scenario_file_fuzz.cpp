// libFuzzer target: the scenario-file parser on arbitrary bytes. Bad input must throw
// InvalidInput; any other exception, a crash, a hang, a leak or a UBSan report is a defect.
#include <cstddef>
#include <cstdint>
#include <string>

#include "gradnorm/scenarios/scenario_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)gradnorm::scenarios::parse_scenario_file(text, "fuzz/scenarios.toml");
  } catch (const gradnorm::scenarios::InvalidInput&) {
    // Refused with a message: what bad input must do.
  }
  return 0;
}
