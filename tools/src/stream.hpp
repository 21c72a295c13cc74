#pragma once
// `gradnorm stream`: the reference stream of ragged steps as a scenario file (docs/speed.md),
// the workload gradnorm's speed figures are about.

#include <cstdint>
#include <string>

namespace gradnorm::tools {

struct StreamOptions {
  int cases = 300;
  std::uint64_t seed = 1;
  std::string out;  // empty: standard output
};

// The stream's TOML: `cases` scenarios "stream/I", drawn from `seed` alone.
[[nodiscard]] std::string stream_toml(int cases, std::uint64_t seed);

int stream_command(const StreamOptions& options);

}  // namespace gradnorm::tools
