#pragma once
// Starts W copies of this program as the ranks of one c10d Gloo process group on this
// machine, watches them, and fails the whole run promptly when one throws, exits or hangs:
// the others are killed, every child is reaped, and the rendezvous folder is removed.

#include <chrono>
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
};

inline constexpr int kExitRankFailed = 3;

// Returns rank 0's exit status when every rank finished, kExitRankFailed after a fault (the
// cause, naming the rank, is printed on standard error).
int supervise(const SupervisorOptions& options);

// Where a failing rank leaves its one-line cause for the supervisor ($GRADNORM_STATUS_DIR).
void write_rank_status(int rank, const std::string& cause);
// A rank process that finished its run says so (GRADNORM_STATUS_DIR): the supervisor takes
// exit 0 without it for a rank that ended early.
void write_rank_done(int rank);

}  // namespace gradnorm::tools
