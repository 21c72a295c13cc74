#pragma once
// Starts W copies of this program as the ranks of one c10d Gloo process group on this
// machine, watches them, and fails the whole run promptly when one throws, exits or hangs:
// the others are killed, every child is reaped, and the rendezvous folder is removed.

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace gradnorm::tools {

struct SupervisorOptions {
  int processes = 2;
  // Per collective; the ranks' own c10d timeout. The whole run gets a safety deadline on top.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // Arguments after the program name for every rank ("run --launcher env ...").
  std::vector<std::string> rank_arguments;
  bool rank0_prints = true;  // rank 0's standard output reaches ours; the others' never does
  // Where set, what the run would print on standard error (a fault naming its rank, what rank
  // 0 said there) is put here instead: fuzzing prints it with the counter-example it explains.
  std::string* said = nullptr;
  // Warm rank processes: where set, each rank is this process forked, which then sets its
  // rank's variables and returns warm(argc, argv) as its exit status instead of exec'ing
  // the program anew, keeping what the parent loaded (the interpreter, torch, the step's
  // module). The hooks bracket each fork (the interpreter's, python::before_fork and its
  // pair). Taken only where this process runs no thread but its own; otherwise the ranks are
  // exec'd, with a notice naming the threads.
  std::function<int(int, char**)> warm = nullptr;
  std::function<void()> before_fork = [] {};
  std::function<void()> after_fork_parent = [] {};
  std::function<void(const std::vector<std::string>&)> after_fork_child = [](const std::vector<std::string>&) {};
  // Names of the threads the supervisor's code knows by name (Python's), for the notice.
  std::function<std::vector<std::string>()> named_threads = [] { return std::vector<std::string>{}; };
};

// The command that starts this program again (rank processes, bench children): the
// executable (/proc/self/exe), or what set_self_command gave: [sys.executable, "-m",
// "gradnorm"] under Python (python/gradnorm/__main__.py), where /proc/self/exe is the base
// interpreter and would lose the virtual environment. Set before any thread starts.
const std::vector<std::string>& self_command();
void set_self_command(std::vector<std::string> words);

// The names of the threads this process runs beside the calling one (/proc/self/task).
std::vector<std::string> other_threads();

inline constexpr int kExitRankFailed = 3;

// Returns rank 0's exit status when every rank finished, kExitRankFailed after a fault (the
// cause, naming the rank, is printed on standard error).
int supervise(const SupervisorOptions& options);

// gradnorm bench --ranks: a rank that has made its process group appends "RANK MS KIB" to
// $GRADNORM_BENCH_READY: milliseconds since the supervisor started it, and the memory it
// holds alone (smaps_rollup's Private_Clean + Private_Dirty). Nothing where unset.
void note_rank_ready(int rank);
long monotonic_ns();

// Where a failing rank leaves its one-line cause for the supervisor ($GRADNORM_STATUS_DIR).
void write_rank_status(int rank, const std::string& cause);
// A rank process that finished its run says so (GRADNORM_STATUS_DIR): the supervisor takes
// exit 0 without it for a rank that ended early.
void write_rank_done(int rank);

}  // namespace gradnorm::tools
