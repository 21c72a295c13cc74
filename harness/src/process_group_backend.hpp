#pragma once
// Internal: the c10d process group a rank process reduces through, and where its tensors
// must live for it (CPU for Gloo and for raw NCCL, which stages them to its device itself).

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

#include "gradnorm/harness/transport.hpp"

namespace gradnorm::harness {

struct ProcessGroupBackend {
  c10::intrusive_ptr<c10d::Backend> group;
  std::string name = "gloo";
  at::Device device = at::kCPU;
  // Sum bfloat16 in float32 and round once (Gloo): a 2-rank sum is then the one rounding
  // the thread transport's bfloat16 add makes, whatever order Gloo's algorithm picks.
  bool widen_bfloat16 = false;
};

// A process group over raw NCCL on cuda:L, L the rank's local rank (rendezvous.local_rank,
// else the LOCAL_RANK variable, else rendezvous.rank), taking and returning CPU tensors.
// Throws scenarios::InvalidInput with nccl_unavailable_reason's sentence (transport.hpp)
// when NCCL cannot run here, CommunicationError when the communicator cannot form within
// `timeout`.
ProcessGroupBackend make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                      const Rendezvous& rendezvous,
                                      std::chrono::milliseconds timeout);

}  // namespace gradnorm::harness
