#pragma once
// What the code under test prints while gradnorm runs it (framework chatter: torchao's import
// notice, torch's UserWarnings, DDP's reducer warning): held back from the table and given to
// the row whose code printed it (docs/reliability.md, "Quiet output").
//
// Two channels reach it: Python's sys.stdout and sys.stderr (gradnorm_torch.py replaces them
// with streams that ask hold_output first) and LibTorch's TORCH_WARN, through a per-thread
// c10 warning handler. Output written straight to file descriptor 2 by C++ code on a thread
// gradnorm did not start (c10d's socket notices, glog lines) is not seen here.

#include <string>
#include <string_view>

namespace gradnorm::harness {

enum class OutputMode {
  pass_through,  // nothing is held: the default outside `gradnorm run` (tests, explain, export)
  capture,       // `gradnorm run`: held, each rank's for its row, the rest for the run's log
  live,          // `gradnorm run --verbose`: printed as it comes, nothing held
};

void set_output_mode(OutputMode mode);
[[nodiscard]] OutputMode output_mode();

// For its lifetime, what this thread's code prints is rank RANK's of run KEY (a scenario and
// a variant). Output from a thread of no rank (a thread user code started) goes to the
// lowest active rank when every active rank belongs to one run; otherwise to the run's log.
class RankOutput {
 public:
  RankOutput(std::string key, int rank);
  ~RankOutput();
  RankOutput(const RankOutput&) = delete;
  RankOutput& operator=(const RankOutput&) = delete;

  // What was held so far, whole lines (a last line without its newline gets one).
  [[nodiscard]] std::string take();

  void append(std::string_view text);  // for the handlers; thread-safe

  struct State;  // output_capture.cpp's

 private:
  State* state_;
};

// Takes TEXT that code printed on this thread: true when it is held (for a rank, or for the
// run), false when the caller should print it itself (pass_through or live). Thread-safe.
bool hold_output(std::string_view text);

// What was held outside every rank (imports, a recipe's set-up), whole lines; emptied.
[[nodiscard]] std::string take_run_output();

// TEXT's lines, each after PREFIX.
[[nodiscard]] std::string prefix_lines(std::string_view text, std::string_view prefix);

}  // namespace gradnorm::harness
