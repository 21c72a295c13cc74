#pragma once
// Internal: the c10d process group a rank process reduces through, and where its tensors
// must live for it (CPU for Gloo, the rank's CUDA device for NCCL).

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

#include "gradnorm/harness/transport.hpp"

namespace gradnorm::harness {

struct ProcessGroupBackend {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  std::string name = "gloo";
  at::Device device = at::kCPU;
  bool widen_bfloat16 = false;  // Gloo in LibTorch 1.13 cannot reduce bfloat16
};

// A ProcessGroupNCCL on cuda:LOCAL_RANK (or cuda:RANK); only in a GRADNORM_WITH_NCCL build.
ProcessGroupBackend make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                      const Rendezvous& rendezvous,
                                      std::chrono::milliseconds timeout);

}  // namespace gradnorm::harness
