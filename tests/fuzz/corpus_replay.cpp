// Replays the fuzzer's seed corpus and saved regressions through the scenario-file parser,
// built with the project's own compiler: every file must parse or throw InvalidInput.
// Usage: corpus_replay DIR...   (a missing DIR is skipped; no file at all is a failure)
#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "gradnorm/scenarios/scenario_file.hpp"

namespace fs = std::filesystem;
using gradnorm::scenarios::InvalidInput;

int main(int argc, char** argv) {
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    if (!fs::is_directory(argv[i])) continue;
    for (const auto& entry : fs::directory_iterator(argv[i])) {
      if (entry.is_regular_file()) files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::cerr << "corpus_replay: no file to replay\n";
    return 1;
  }
  int parsed = 0, refused = 0, defects = 0;
  for (const fs::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    try {
      (void)gradnorm::scenarios::parse_scenario_file(text.str(), file.string());
      ++parsed;
    } catch (const InvalidInput&) {
      ++refused;
    } catch (const std::exception& error) {
      ++defects;
      std::cerr << file.string() << ": not InvalidInput: " << error.what() << '\n';
    } catch (...) {
      ++defects;
      std::cerr << file.string() << ": a non-std exception escaped\n";
    }
  }
  std::cout << "corpus_replay: " << files.size() << " files: " << parsed << " parsed, " << refused
            << " refused with InvalidInput, " << defects << " defects\n";
  return defects == 0 ? 0 : 1;
}
