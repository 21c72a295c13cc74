#pragma once
// Where a rank process's c10d Gloo groups come from (docs/design.md §7). torch's wheel builds
// Gloo statically and ships none of its headers, and ProcessGroupGloo.hpp includes them, so
// C++ cannot construct a ProcessGroupGloo itself. The rank's embedded interpreter makes each
// group with torch.distributed instead (gradnorm::python installs the maker), and the
// harness reduces through the very same c10d::Backend object by its public header: one
// engine for the harness's collectives and a Python step's, with no hand-written collective.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

namespace gradnorm::harness {

struct GlooGroupRequest {
  c10::intrusive_ptr<c10d::Store> store;  // every member passes a store with the same keys
  int rank = 0;                           // this process's rank in the group
  int size = 1;
  std::chrono::milliseconds timeout{60'000};
  // The process's default group (torch.distributed's WORLD, which a Python step's collectives
  // and DistributedDataParallel use); otherwise a group of its own (a mesh's subgroup).
  bool world = false;
};

// Makes the group and returns its Gloo backend; throws c10::Error or std::runtime_error
// with the reason when the group cannot form.
using GlooGroupMaker = c10::intrusive_ptr<c10d::Backend> (*)(const GlooGroupRequest&);

// Installed once at start-up, before any rank process forms its groups.
void set_gloo_group_maker(GlooGroupMaker maker);

}  // namespace gradnorm::harness
