// Ranks as processes over PyTorch's own c10d process groups (Gloo always; NCCL where LibTorch
// was built with CUDA). No hand-written networking: collectives are c10d's, rendezvous is a
// c10d FileStore or TCPStore.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <thread>

#include "gradnorm/harness/transport.hpp"
#include "process_group_backend.hpp"

namespace gradnorm::harness {
namespace {

std::string required_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    throw scenarios::InvalidInput(fmt::format(
        "environment variable {} is not set: a process rank needs RANK, WORLD_SIZE and either "
        "GRADNORM_STORE=file:PATH or MASTER_ADDR and MASTER_PORT",
        name));
  }
  return value;
}

int integer_env(const char* name, int low, int high) {
  const std::string text = required_env(name);
  try {
    std::size_t used = 0;
    const int value = std::stoi(text, &used);
    if (used == text.size() && value >= low && value <= high) return value;
  } catch (const std::logic_error&) {
  }
  throw scenarios::InvalidInput(
      fmt::format("environment variable {}='{}': expected an integer in [{}, {}]", name, text, low, high));
}

// A CommunicationError that names this rank and the collective's LibTorch error.
[[noreturn]] void collective_failed(int rank, const char* what, const std::exception& error) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&error);
  throw CommunicationError(fmt::format(
      "rank {}: {} failed: {}", rank, what,
      first_line(torch_error ? torch_error->what_without_backtrace() : error.what())));
}

// Makes (once) the process group of a subgroup of world ranks, for this process.
using SubgroupFactory = std::function<const ProcessGroupBackend&(const std::vector<int>& ranks)>;

class ProcessGroupCommunicator final : public Communicator {
 public:
  ProcessGroupCommunicator(const ProcessGroupBackend& backend, int rank, int world,
                           std::chrono::milliseconds timeout, SubgroupFactory subgroups = {})
      : backend_(backend),
        rank_(rank),
        world_(world),
        timeout_(timeout),
        subgroups_(std::move(subgroups)) {}

  Communicator& group(const std::vector<int>& ranks) override {
    if (static_cast<int>(ranks.size()) == world_) return *this;
    if (!subgroups_) return Communicator::group(ranks);
    auto found = groups_.find(ranks);
    if (found == groups_.end()) {
      const auto me = std::find(ranks.begin(), ranks.end(), rank_);
      TORCH_INTERNAL_ASSERT(me != ranks.end(), "harness bug: rank ", rank_, " asked for a group without it");
      found = groups_.emplace(ranks, std::make_unique<ProcessGroupCommunicator>(
                                         subgroups_(ranks), static_cast<int>(me - ranks.begin()),
                                         static_cast<int>(ranks.size()), timeout_))
                  .first;
    }
    return *found->second;
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string kind() const override { return backend_.name; }

  void all_reduce_sum(std::vector<at::Tensor>& tensors) override {
    if (tensors.empty()) return barrier();
    try {
      for (at::Tensor& tensor : tensors) {
        // LibTorch 1.13's Gloo has no bfloat16: reduce in float32 and round once.
        const bool widen = backend_.widen_bfloat16 && tensor.scalar_type() == at::kBFloat16;
        at::Tensor staged = widen ? tensor.to(at::kFloat) : tensor;
        std::vector<at::Tensor> one{staged.to(backend_.device)};
        backend_.group->allreduce(one)->wait(timeout_);
        at::NoGradGuard no_grad;
        tensor.copy_(one[0].to(at::kCPU));
      }
    } catch (const std::exception& error) {  // c10::Error, or gloo's own IoException
      collective_failed(rank_, "all-reduce", error);
    }
  }

  void barrier() override {
    try {
      backend_.group->barrier()->wait(timeout_);
    } catch (const std::exception& error) {
      collective_failed(rank_, "barrier", error);
    }
  }

 private:
  const ProcessGroupBackend& backend_;
  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  SubgroupFactory subgroups_;
  std::map<std::vector<int>, std::unique_ptr<ProcessGroupCommunicator>> groups_;
};

class ProcessGroupTransport final : public Transport {
 public:
  ProcessGroupTransport(const Rendezvous& rendezvous, RunOptions options, const std::string& backend)
      : rendezvous_(rendezvous), options_(std::move(options)) {
    try {
      if (!rendezvous.file_store.empty()) {
        store_ = c10::make_intrusive<c10d::FileStore>(rendezvous.file_store, rendezvous.world_size);
      } else {
        c10d::TCPStoreOptions tcp;
        tcp.port = static_cast<std::uint16_t>(rendezvous.master_port);
        tcp.isServer = rendezvous.rank == 0;
        tcp.numWorkers = rendezvous.world_size;
        tcp.waitWorkers = true;
        tcp.timeout = options_.timeout;
        store_ = c10::make_intrusive<c10d::TCPStore>(rendezvous.master_addr, tcp);
      }
      store_->setTimeout(options_.timeout);
      auto group_store = c10::make_intrusive<c10d::PrefixStore>("group", store_);
      if (backend == "nccl") {
        backend_ = make_nccl_backend(group_store, rendezvous, options_.timeout);
      } else {
        auto gloo_options = c10d::ProcessGroupGloo::Options::create(options_.timeout);
        gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(
            rendezvous.file_store.empty() ? rendezvous.master_addr : "127.0.0.1"));
        backend_.group = c10::make_intrusive<c10d::ProcessGroupGloo>(
            group_store, rendezvous.rank, rendezvous.world_size, gloo_options);
        backend_.name = "gloo";
        backend_.widen_bfloat16 = true;
      }
    } catch (const c10::Error& error) {
      throw CommunicationError(fmt::format("rank {}: rendezvous failed: {}", rendezvous.rank,
                                           first_line(error.what_without_backtrace())));
    }
    FaultInjection& fault = options_.fault;
    fault.hang = [] {
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the supervisor kills us
    };
  }

  RankedRun run(const VariantSpec& variant, const scenarios::Scenario& scenario) override {
    scenarios::validate(scenario);
    if (scenario.world_size != rendezvous_.world_size) {
      throw scenarios::InvalidInput(fmt::format(
          "scenario '{}' has world_size {} but this process group has {} ranks", scenario.name,
          scenario.world_size, rendezvous_.world_size));
    }
    if (scenario.has_mesh() && backend_.name != "gloo") {
      throw scenarios::InvalidInput(fmt::format(
          "scenario '{}' has a mesh (dp_replicate {}, tp {}, cp {}): its subgroups run over "
          "Gloo or threads, not {}",
          scenario.name, scenario.dp_replicate, scenario.tp, scenario.cp, backend_.name));
    }
    if (auto why = not_applicable(variant, scenario)) {
      throw scenarios::InvalidInput(fmt::format("variant '{}' cannot run scenario '{}': {}",
                                                variant.name, scenario.name, *why));
    }
    ProcessGroupCommunicator comm(
        backend_, rendezvous_.rank, rendezvous_.world_size, options_.timeout,
        [this](const std::vector<int>& ranks) -> const ProcessGroupBackend& {
          return subgroup(ranks);
        });
    const Observation mine =
        run_rank(variant, scenario, scenario_batches(scenario), comm, options_.fault);
    // Every rank publishes its observation and reads everyone else's.
    const std::string key = fmt::format("obs/{}", run_index_++);
    RankedRun out;
    try {
      const std::string blob = serialize(mine);
      store_->set(fmt::format("{}/{}", key, rendezvous_.rank),
                  std::vector<std::uint8_t>(blob.begin(), blob.end()));
      for (int rank = 0; rank < rendezvous_.world_size; ++rank) {
        if (rank == rendezvous_.rank) {
          out.ranks.push_back(mine);
          continue;
        }
        const std::vector<std::uint8_t> theirs = store_->get(fmt::format("{}/{}", key, rank));
        out.ranks.push_back(deserialize(std::string(theirs.begin(), theirs.end())));
      }
    } catch (const std::exception& error) {
      collective_failed(rendezvous_.rank, "observation exchange", error);
    }
    return out;
  }

  int world_size() const override { return rendezvous_.world_size; }
  int rank() const override { return rendezvous_.rank; }
  std::string kind() const override { return backend_.name; }

 private:
  // A ProcessGroupGloo among `ranks`, made by every member the first time it reaches the
  // collective that needs it (the same point on each), kept for later runs.
  const ProcessGroupBackend& subgroup(const std::vector<int>& ranks) {
    auto found = subgroups_.find(ranks);
    if (found != subgroups_.end()) return found->second;
    const int index = static_cast<int>(std::find(ranks.begin(), ranks.end(), rendezvous_.rank) -
                                       ranks.begin());
    try {
      auto store = c10::make_intrusive<c10d::PrefixStore>(
          fmt::format("group-{}", fmt::join(ranks, "-")), store_);
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(options_.timeout);
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(
          rendezvous_.file_store.empty() ? rendezvous_.master_addr : "127.0.0.1"));
      ProcessGroupBackend backend;
      backend.group = c10::make_intrusive<c10d::ProcessGroupGloo>(
          store, index, static_cast<int>(ranks.size()), gloo_options);
      backend.name = "gloo";
      backend.widen_bfloat16 = true;
      return subgroups_.emplace(ranks, std::move(backend)).first->second;
    } catch (const c10::Error& error) {
      throw CommunicationError(fmt::format("rank {}: subgroup {} failed to form: {}",
                                           rendezvous_.rank, fmt::join(ranks, ", "),
                                           first_line(error.what_without_backtrace())));
    }
  }

  std::map<std::vector<int>, ProcessGroupBackend> subgroups_;
  Rendezvous rendezvous_;
  RunOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  ProcessGroupBackend backend_;
  long run_index_ = 0;
};

}  // namespace

Rendezvous rendezvous_from_environment() {
  Rendezvous r;
  r.world_size = integer_env("WORLD_SIZE", 1, 4096);
  r.rank = integer_env("RANK", 0, r.world_size - 1);
  const char* store = std::getenv("GRADNORM_STORE");
  if (store != nullptr && *store != '\0') {
    const std::string text = store;
    if (text.rfind("file:", 0) != 0 || text.size() <= 5) {
      throw scenarios::InvalidInput(fmt::format(
          "GRADNORM_STORE='{}': expected file:PATH (a FileStore path every rank can reach)", text));
    }
    r.file_store = text.substr(5);
    return r;
  }
  r.master_addr = required_env("MASTER_ADDR");
  r.master_port = integer_env("MASTER_PORT", 1, 65535);
  return r;
}

std::unique_ptr<Transport> make_process_group_transport(const Rendezvous& rendezvous,
                                                        RunOptions options,
                                                        const std::string& backend) {
  if (backend != "gloo" && backend != "nccl") {
    throw scenarios::InvalidInput(fmt::format("unknown backend '{}': expected gloo or nccl", backend));
  }
  if (backend == "nccl" && !nccl_compiled_in()) {
    throw scenarios::InvalidInput(
        "this gradnorm was built without NCCL: configure with -DGRADNORM_WITH_NCCL=ON against a "
        "CUDA-enabled LibTorch (see the README)");
  }
  return std::make_unique<ProcessGroupTransport>(rendezvous, std::move(options), backend);
}

}  // namespace gradnorm::harness
