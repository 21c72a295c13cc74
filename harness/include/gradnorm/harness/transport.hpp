#pragma once
// Where a scenario x variant runs: every rank as a thread of this process, or this process
// as one rank of a c10d Gloo process group. Either way the caller gets every rank's
// Observation back, so judging is the same.

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "gradnorm/harness/runner.hpp"

namespace gradnorm::harness {

class Transport {
 public:
  virtual ~Transport() = default;
  // Runs `variant` on `scenario`; throws InvalidInput for a pair the harness cannot run.
  [[nodiscard]] virtual RankedRun run(const VariantSpec& variant,
                                      const scenarios::Scenario& scenario) = 0;
  // The world size this transport serves; 0 when it serves any (threads).
  [[nodiscard]] virtual int world_size() const = 0;
  // This process's rank (0 for threads): only rank 0 reports.
  [[nodiscard]] virtual int rank() const = 0;
  [[nodiscard]] virtual std::string kind() const = 0;
  // This rank is about to leave with `cause`: tell the peers, so that every rank ends within
  // the timeout naming it rather than waiting for a rank that will never come. Returns the
  // cause to print, with the rank at fault named where this rank was only its victim.
  virtual std::string abort(const std::string& cause) { return cause; }
  // This rank finished its runs; a rank that serves the rendezvous store waits (up to the
  // timeout) until every peer has too before it may exit and take the store with it.
  virtual void finish() {}
};

class ThreadTransport final : public Transport {
 public:
  explicit ThreadTransport(RunOptions options) : options_(std::move(options)) {}
  RankedRun run(const VariantSpec& variant, const scenarios::Scenario& scenario) override {
    return run_in_threads(variant, scenario, options_);
  }
  int world_size() const override { return 0; }
  int rank() const override { return 0; }
  std::string kind() const override { return "threads"; }

 private:
  RunOptions options_;
};

// Where a process finds its peers, and who started it (docs/design.md §13).
struct Rendezvous {
  int rank = 0;
  int world_size = 1;
  int local_rank = -1;        // LOCAL_RANK / SLURM_LOCALID; -1 when the launcher gave none
  int local_world_size = -1;  // LOCAL_WORLD_SIZE; -1 when not given
  int group_rank = -1;        // GROUP_RANK (torchrun's node rank) / SLURM_NODEID
  std::string file_store;   // "file" rendezvous: a FileStore path shared by every rank
  std::string master_addr;  // "tcp" rendezvous: a TCPStore here (served by rank 0 or the agent)
  int master_port = 0;
  // torchrun's elastic agent already serves the TCPStore on MASTER_ADDR:MASTER_PORT
  // (TORCHELASTIC_USE_AGENT_STORE=True): every rank is a client. Keys are unprefixed, as
  // torch.distributed's own ranks keep them: the agent serves a fresh store per restart.
  bool agent_store = false;
  int restart_count = 0;   // TORCHELASTIC_RESTART_COUNT
  std::string run_id;      // TORCHELASTIC_RUN_ID (not in reports: it differs run to run)
  std::string launcher = "env";  // env, torchrun or slurm: who set the variables
};

// Reads RANK and WORLD_SIZE, then GRADNORM_STORE=file:PATH or MASTER_ADDR and MASTER_PORT
// (the torchrun convention), and torchrun's LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK and
// TORCHELASTIC_* variables where set; throws InvalidInput naming the missing or malformed
// variable. Without RANK but with SLURM_PROCID it reads Slurm's variables instead.
[[nodiscard]] Rendezvous rendezvous_from_environment();

// Slurm's task variables: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID and the
// first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST); MASTER_ADDR and MASTER_PORT
// override the host and the port, which is otherwise kSlurmBasePort + SLURM_JOB_ID % 10000.
inline constexpr int kSlurmBasePort = 29500;
[[nodiscard]] Rendezvous rendezvous_from_slurm();

// The first host of a Slurm hostlist: "node[07-09,12],gpu1" -> "node07",
// "rack[1-2]-n[3,5]" -> "rack1-n3"; throws InvalidInput for an empty or malformed list.
[[nodiscard]] std::string first_slurm_host(const std::string& hostlist);

// How the run's settings name a process-group run: "gloo processes x 2", plus the launcher
// and a restart above 0 ("gloo processes x 2 under torchrun (agent store, restart 1)").
[[nodiscard]] std::string describe_process_group(const Rendezvous& rendezvous,
                                                 const std::string& backend);

// This process as one rank of a c10d process group on `rendezvous`: backend "gloo", or
// "nccl" where raw NCCL is compiled in and can run (throws InvalidInput with
// nccl_unavailable_reason's sentence otherwise).
// Each run's observations are exchanged through the store, so every rank returns the full
// RankedRun.
[[nodiscard]] std::unique_ptr<Transport> make_process_group_transport(
    const Rendezvous& rendezvous, RunOptions options, const std::string& backend = "gloo");

// A 64-bit FNV-1a digest of every number a user sees in the observation (gradients,
// parameters, grad norms, logged losses, in order) and its error: equal digests mean
// bit-identical observations, whichever transport produced them.
[[nodiscard]] std::uint64_t digest(const Observation& observation);

// True in a build that found a CUDA toolkit with NCCL (docs/design.md §13).
[[nodiscard]] bool nccl_compiled_in();
// Why --backend nccl cannot run here on cuda:`device_index`, as a sentence naming what is
// missing (the CUDA runtime or NCCL library, a driver, a GPU, that device, or NCCL in this
// build); nullopt when it can. Never throws; loads libcudart and libnccl on its first call.
[[nodiscard]] std::optional<std::string> nccl_unavailable_reason(int device_index);

// Observation <-> bytes (LibTorch pickle for tensors, JSON for the rest).
[[nodiscard]] std::string serialize(const Observation& observation);
[[nodiscard]] Observation deserialize(const std::string& bytes);

}  // namespace gradnorm::harness
