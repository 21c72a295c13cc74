#pragma once
// Where a scenario x variant runs: every rank as a thread of this process, or this process
// as one rank of a c10d Gloo process group. Either way the caller gets every rank's
// Observation back, so judging is the same.

#include <chrono>
#include <memory>
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

// Where a process finds its peers.
struct Rendezvous {
  int rank = 0;
  int world_size = 1;
  std::string file_store;   // "file" rendezvous: a FileStore path shared by every rank
  std::string master_addr;  // "tcp" rendezvous: rank 0 serves a TCPStore here
  int master_port = 0;
};

// Reads RANK and WORLD_SIZE, then GRADNORM_STORE=file:PATH or MASTER_ADDR and MASTER_PORT
// (the torchrun convention); throws InvalidInput naming the missing or malformed variable.
[[nodiscard]] Rendezvous rendezvous_from_environment();

// This process as one rank of a c10d process group on `rendezvous`: backend "gloo", or
// "nccl" in a build configured with GRADNORM_WITH_NCCL (throws InvalidInput otherwise).
// Each run's observations are exchanged through the store, so every rank returns the full
// RankedRun.
[[nodiscard]] std::unique_ptr<Transport> make_process_group_transport(
    const Rendezvous& rendezvous, RunOptions options, const std::string& backend = "gloo");

// A 64-bit FNV-1a digest of every number a user sees in the observation (gradients,
// parameters, grad norms, logged losses, in order) and its error: equal digests mean
// bit-identical observations, whichever transport produced them.
[[nodiscard]] std::uint64_t digest(const Observation& observation);

// True in a build configured with GRADNORM_WITH_NCCL (against a CUDA-enabled LibTorch).
[[nodiscard]] bool nccl_compiled_in();

// Observation <-> bytes (LibTorch pickle for tensors, JSON for the rest).
[[nodiscard]] std::string serialize(const Observation& observation);
[[nodiscard]] Observation deserialize(const std::string& bytes);

}  // namespace gradnorm::harness
