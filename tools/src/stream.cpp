// The reference stream: per case, world size W uniform in 1..8, accumulation A uniform in
// 1..4, per (rank, micro-batch) a valid-token count uniform in 0..64; one sequence of 65
// positions per micro-batch (64 labels, the last position ignored) with random holes;
// vocab 32, hidden 16, the causal LM, float32, SGD, no clipping. A case whose counts are
// all zero is drawn again.
#include "stream.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <random>
#include <sstream>

#include "gradnorm/reports/report.hpp"
#include "gradnorm/scenarios/files.hpp"
#include "gradnorm/scenarios/scenario.hpp"
#include "gradnorm/scenarios/scenario_file.hpp"

namespace gradnorm::tools {

std::string stream_toml(int cases, std::uint64_t seed) {
  // mt19937_64 and uniform_int_distribution's algorithm are fixed by libstdc++, so a seed
  // gives the same file on every machine this builds on.
  std::mt19937_64 generator(seed);
  auto uniform = [&generator](int low, int high) {
    return std::uniform_int_distribution<int>(low, high)(generator);
  };
  std::ostringstream out;
  out << fmt::format("# gradnorm stream --cases {} --seed {}\n", cases, seed);
  for (int i = 0; i < cases; ++i) {
    const int world = uniform(1, 8);
    const int accumulation = uniform(1, 4);
    std::vector<std::vector<int>> counts;
    long total = 0;
    do {
      counts.assign(static_cast<std::size_t>(world), std::vector<int>(static_cast<std::size_t>(accumulation)));
      total = 0;
      for (auto& rank : counts) {
        for (int& count : rank) {
          count = uniform(0, 64);
          total += count;
        }
      }
    } while (total == 0);
    out << fmt::format(
        "\n[[scenario]]\nname = \"stream/{}\"\nseed = {}\nvalid_tokens = {}\n"
        "micro_batch_size = 1\nsequence_length = 65\nmask = \"random_holes\"\n"
        "vocab_size = 32\nhidden_size = 16\nmodel = \"causal_lm\"\ndtype = \"float32\"\n"
        "optimizer = \"sgd\"\n",
        i, seed * 1000003ULL + static_cast<std::uint64_t>(i), fmt::format("{}", counts));
  }
  return out.str();
}

int stream_command(const StreamOptions& options) {
  // Checked before any work: a device, a FIFO or a folder is never replaced by the stream.
  if (!options.out.empty()) {
    if (auto why = scenarios::why_unwritable(options.out)) {
      throw scenarios::InvalidInput(fmt::format("--out {}: {}", options.out, *why));
    }
  }
  const std::string text = stream_toml(options.cases, options.seed);
  if (text.size() > scenarios::kMaxScenarioFileBytes) {  // the --cases bound keeps it within
    throw scenarios::InvalidInput(fmt::format(
        "stream: {} cases make {} bytes, more than the {} a scenario file may hold: ask for fewer",
        options.cases, text.size(), scenarios::kMaxScenarioFileBytes));
  }
  if (options.out.empty()) {
    fmt::print("{}", text);
  } else {
    reports::write_file_atomically(options.out, text);
  }
  return 0;
}

}  // namespace gradnorm::tools
