#pragma once
// Runs the gradnorm binary (GRADNORM_CLI, set by tests/CMakeLists.txt) as a user would, for
// the tests that drive the command line: exit status and stdout and stderr interleaved.
#include <sys/wait.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradnorm::testing_support {

struct CliResult {
  int exit_code = -1;  // -1 when the process did not exit normally
  std::string output;  // stdout and stderr, interleaved
};

inline std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

inline std::string command_line(const std::vector<std::string>& args) {
  std::string line = shell_quote(GRADNORM_CLI);
  for (const std::string& arg : args) line += " " + shell_quote(arg);
  return line;
}

// Runs a shell line and keeps its output (stdout and stderr) and exit status.
inline CliResult run_shell(const std::string& line) {
  CliResult result;
  FILE* pipe = popen(line.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen failed for " + line);
  char buffer[4096];
  for (std::size_t count = 0; (count = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) {
    result.output.append(buffer, count);
  }
  const int status = pclose(pipe);
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

// `prefix` runs before the command in the same shell (cd, ulimit, environment).
inline CliResult run_cli(const std::vector<std::string>& args, const std::string& prefix = "") {
  return run_shell((prefix.empty() ? "" : prefix + " && ") + command_line(args) + " 2>&1");
}

// Prints the command and its output with every failed expectation about it.
inline std::string explain(const std::vector<std::string>& args, const CliResult& result) {
  return "$ " + command_line(args) + "\n(exit " + std::to_string(result.exit_code) + ")\n" +
         result.output;
}

}  // namespace gradnorm::testing_support
