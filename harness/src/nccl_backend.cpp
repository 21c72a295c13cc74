// ProcessGroupNCCL for ranks on CUDA devices. Compiled only with GRADNORM_WITH_NCCL against
// a CUDA-enabled LibTorch; the default (CPU) build gets the stubs at the bottom.
#include <fmt/format.h>

#include <cstdlib>

#include "process_group_backend.hpp"

#ifdef GRADNORM_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace gradnorm::harness {

#ifdef GRADNORM_WITH_NCCL

bool nccl_compiled_in() { return true; }

ProcessGroupBackend make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                      const Rendezvous& rendezvous,
                                      std::chrono::milliseconds timeout) {
  const char* local = std::getenv("LOCAL_RANK");
  const int device_index = local != nullptr ? std::atoi(local) : rendezvous.rank;
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  ProcessGroupBackend backend;
  backend.group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rendezvous.rank,
                                                              rendezvous.world_size, options);
  backend.name = "nccl";
  backend.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index));
  backend.widen_bfloat16 = false;  // NCCL reduces bfloat16 natively
  return backend;
}

#else

bool nccl_compiled_in() { return false; }

ProcessGroupBackend make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, const Rendezvous&,
                                      std::chrono::milliseconds) {
  throw scenarios::InvalidInput("this gradnorm was built without NCCL (GRADNORM_WITH_NCCL=OFF)");
}

#endif

}  // namespace gradnorm::harness
