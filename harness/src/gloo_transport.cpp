// Ranks as processes over PyTorch's own c10d process groups (Gloo always; raw NCCL, loaded at
// run time, where the build found the CUDA toolkit: see nccl_backend.cpp). No hand-written
// networking: collectives are c10d's, rendezvous is a c10d FileStore or TCPStore.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fmt/format.h>

#include <filesystem>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "gradnorm/harness/gloo_groups.hpp"
#include "gradnorm/harness/transport.hpp"
#include "process_group_backend.hpp"

namespace gradnorm::harness {
namespace {

std::string required_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    throw scenarios::InvalidInput(fmt::format(
        "environment variable {} is not set: a process rank needs RANK, WORLD_SIZE and either "
        "GRADNORM_STORE=file:PATH or MASTER_ADDR and MASTER_PORT (or, under Slurm, "
        "SLURM_PROCID, SLURM_NTASKS and SLURM_JOB_NODELIST)",
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

std::optional<std::string> optional_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

// An integer variable where set; -1 (or `absent`) where not.
int optional_integer_env(const char* name, int low, int high, int absent = -1) {
  if (!optional_env(name)) return absent;
  return integer_env(name, low, high);
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

std::atomic<GlooGroupMaker> gloo_group_maker{nullptr};

// The interface Gloo's pairs listen on, as torch.distributed chooses it: GLOO_SOCKET_IFNAME
// where set, else the address this host's name resolves to, so ranks on other hosts can
// reach it (not MASTER_ADDR, which is rank 0's). A loopback rendezvous (a FileStore, or
// MASTER_ADDR on 127.x) listens on loopback: GLOO_SOCKET_IFNAME=lo for this process, unless
// the user chose an interface.
void choose_gloo_interface(const Rendezvous& rendezvous) {
  if (optional_env("GLOO_SOCKET_IFNAME")) return;
  if (!rendezvous.file_store.empty() || is_loopback(rendezvous.master_addr)) {
    ::setenv("GLOO_SOCKET_IFNAME", "lo", /*overwrite=*/0);
  }
}

// The first line of an error, without LibTorch's backtrace.
std::string error_text(const std::exception& error) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&error);
  return first_line(torch_error ? torch_error->what_without_backtrace() : error.what());
}

// A CommunicationError that names this rank and the collective's LibTorch error.
[[noreturn]] void collective_failed(int rank, const char* what, const std::exception& error) {
  throw CommunicationError(fmt::format("rank {}: {} failed: {}", rank, what, error_text(error)));
}

// Whether this rank serves the TCPStore: rank 0, unless torchrun's agent already does (then
// serving it again fails to bind).
bool serves_tcp_store(const Rendezvous& rendezvous) {
  return rendezvous.file_store.empty() && rendezvous.rank == 0 && !rendezvous.agent_store;
}

std::string store_server(const Rendezvous& rendezvous) {
  return rendezvous.agent_store ? "torchrun's agent" : "rank 0";
}

// The TCPStore, made on a thread of its own and waited for --timeout and 5 s: a client whose
// server accepts the connection and never answers (another program on MASTER_PORT) waits in
// the store's handshake with no bound of its own (a measured 120 s and more). What still runs
// there holds only what it owns.
c10::intrusive_ptr<c10d::Store> connect_bounded(const Rendezvous& rendezvous,
                                                const c10d::TCPStoreOptions& tcp) {
  auto made = std::make_shared<std::promise<c10::intrusive_ptr<c10d::Store>>>();
  std::future<c10::intrusive_ptr<c10d::Store>> store = made->get_future();
  std::thread([made, host = rendezvous.master_addr, tcp] {
    try {
      made->set_value(c10::make_intrusive<c10d::TCPStore>(host, tcp));
    } catch (...) {
      made->set_exception(std::current_exception());
    }
  }).detach();
  const auto bound = std::chrono::duration_cast<std::chrono::milliseconds>(tcp.timeout) +
                     std::chrono::seconds(5);
  if (store.wait_for(bound) != std::future_status::ready) {
    throw std::runtime_error(fmt::format(
        "no answer within {} ms: something at {}:{} accepts connections but does not speak "
        "the TCPStore protocol (another program on MASTER_PORT?), or {} is stuck",
        bound.count(), rendezvous.master_addr, rendezvous.master_port,
        rendezvous.agent_store ? "torchrun's agent" : "rank 0"));
  }
  return store.get();
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
        tcp.isServer = serves_tcp_store(rendezvous);
        tcp.numWorkers = rendezvous.world_size;
        tcp.waitWorkers = true;
        tcp.timeout = options_.timeout;
        // Under torchrun's agent store, keys go unprefixed, as torch.distributed's own ranks
        // keep them on torch >= 2.x: the agent makes a fresh store for every restart
        // (torch/distributed/rendezvous.py, _create_c10d_store), so no attempt reads another's.
        store_ = connect_bounded(rendezvous, tcp);
      }
      store_->setTimeout(options_.timeout);
      auto group_store = c10::make_intrusive<c10d::PrefixStore>("group", store_);
      if (backend == "nccl") {
        backend_ = make_nccl_backend(group_store, rendezvous, options_.timeout);
      } else {
        choose_gloo_interface(rendezvous);
        backend_ = gloo_backend(group_store, rendezvous.rank, rendezvous.world_size, /*world=*/true);
      }
    } catch (const scenarios::InvalidInput&) {
      throw;
    } catch (const std::exception& error) {  // c10::Error, or a socket's own runtime_error
      std::string where;
      if (rendezvous.file_store.empty()) {
        where = fmt::format(" (the store at {}:{}, served by {})", rendezvous.master_addr,
                            rendezvous.master_port, store_server(rendezvous));
      }
      const std::string said = error_text(error);
      std::string hint;
      if (serves_tcp_store(rendezvous) && said.find("bind") == std::string::npos) {
        hint = fmt::format("; rank 0 serves the store and waited {} ms for the other {} rank{} to "
                           "connect",
                           options_.timeout.count(), rendezvous.world_size - 1,
                           rendezvous.world_size == 2 ? "" : "s");
      }
      throw CommunicationError(
          fmt::format("rank {}: rendezvous failed{}: {}{}", rendezvous.rank, where, said, hint));
    }
    FaultInjection& fault = options_.fault;
    fault.hang = [] {
      // The supervisor, or the watchdog once a peer gives up on us, ends this process.
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    };
    if (rendezvous.file_store.empty()) start_watchdog();
  }

  ~ProcessGroupTransport() override { stop_watchdog(); }
  ProcessGroupTransport(const ProcessGroupTransport&) = delete;
  ProcessGroupTransport& operator=(const ProcessGroupTransport&) = delete;

  std::string abort(const std::string& cause) override {
    if (!rendezvous_.file_store.empty()) return cause;  // the supervisor ends the others
    watch_->leaving = true;
    // Every store call may block for good where the store's host or link went down (a socket
    // that neither answers nor closes): the conversation runs on a thread of its own, waited
    // for a bounded time, holding only what it owns.
    auto said = std::make_shared<std::promise<std::string>>();
    std::future<std::string> answer = said->get_future();
    std::thread([said, store = store_, rendezvous = rendezvous_, cause] {
      try {
        said->set_value(explain(*store, rendezvous, cause));
      } catch (...) {
        said->set_exception(std::current_exception());
      }
    }).detach();
    std::string message;
    const auto bound = watchdog_period() * 15;
    if (answer.wait_for(bound) != std::future_status::ready) {
      message = fmt::format("{}; the rendezvous store at {}:{} did not answer within {} ms ({} serves it: "
                            "its host or the network link to it is down)",
                            cause, rendezvous_.master_addr, rendezvous_.master_port, bound.count(),
                            store_server(rendezvous_));
    } else {
      try {
        message = answer.get();
      } catch (const std::exception&) {
        // The store is gone with its server: the peers' watchdogs see that for themselves.
        message = fmt::format("{}; the rendezvous store at {}:{} no longer answers ({} served it)", cause,
                              rendezvous_.master_addr, rendezvous_.master_port, store_server(rendezvous_));
      }
    }
    stop_watchdog();
    // A rank serving the store keeps it up a moment so the peers' watchdogs read why.
    if (serves_tcp_store(rendezvous_)) std::this_thread::sleep_for(watchdog_period() * 3);
    return message;
  }

  // What this rank tells the others through the store as it aborts, and the message it ends
  // with: its cause, and where a peer is to blame, that peer.
  static std::string explain(c10d::Store& store, const Rendezvous& rendezvous, const std::string& cause) {
    std::string message = cause;
    store.set(failed_key(rendezvous.rank), bytes(cause));
    if (cause.find(" failed: ") != std::string::npos) {
      // A rank that failed inside a collective is usually a victim: name the ranks that
      // never said why they left, after a moment in which the other victims say so.
      std::vector<int> silent;
      const auto grace = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
      do {
        silent.clear();
        for (int rank = 0; rank < rendezvous.world_size; ++rank) {
          if (rank == rendezvous.rank) continue;
          if (!store.check({failed_key(rank)}) && !store.check({done_key(rank)})) silent.push_back(rank);
        }
        if (silent.empty()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      } while (std::chrono::steady_clock::now() < grace);
      std::string culprit;
      for (int rank = 0; rank < rendezvous.world_size && culprit.empty(); ++rank) {
        if (rank == rendezvous.rank || !store.check({failed_key(rank)})) continue;
        const std::string theirs = text(store.get(failed_key(rank)));
        if (theirs.find(" failed: ") == std::string::npos) culprit = theirs;
      }
      if (!culprit.empty()) {
        message = fmt::format("{}; because {}", cause, culprit);
      } else if (!silent.empty()) {
        message = fmt::format("{}; rank {} said nothing (it died, hangs or never arrived)", cause,
                              fmt::join(silent, ", "));
      }
    } else if (cause.find(" did not return within ") != std::string::npos) {
      // A step that hung may be waiting for a peer that is gone: name it where its heartbeat
      // stopped (a peer that is only slow, or hangs in its own step, still beats).
      if (const std::vector<int> gone = unheard(store, rendezvous); !gone.empty()) {
        message = fmt::format(
            "{}; rank {} has not been heard from in {} ms (its heartbeat through the store stopped: "
            "its process died, or its host or network link went down)",
            cause, fmt::join(gone, ", "), (watchdog_period() * 3).count());
      }
    }
    store.set(abort_key(), bytes(message));
    return message;
  }

  void finish() override {
    if (!rendezvous_.file_store.empty()) return;
    watch_->leaving = true;
    try {
      store_->set(done_key(rendezvous_.rank), bytes("done"));
      if (serves_tcp_store(rendezvous_)) {
        std::vector<std::string> keys;
        for (int rank = 0; rank < rendezvous_.world_size; ++rank) keys.push_back(done_key(rank));
        store_->wait(keys, options_.timeout);
      }
    } catch (const std::exception& error) {
      stop_watchdog();
      collective_failed(rendezvous_.rank, "waiting for every rank to finish", error);
    }
    stop_watchdog();
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
      return subgroups_.emplace(ranks, gloo_backend(store, index, static_cast<int>(ranks.size())))
          .first->second;
    } catch (const std::exception& error) {
      throw CommunicationError(fmt::format("rank {}: subgroup {} failed to form: {}",
                                           rendezvous_.rank, fmt::join(ranks, ", "),
                                           error_text(error)));
    }
  }

  // A Gloo group of `size` ranks on `store`, this process as `rank` of it, made by the
  // embedded interpreter's torch.distributed (gloo_groups.hpp); the world group is the
  // process's default one, which a Python step's torch.distributed uses too.
  ProcessGroupBackend gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                   int size, bool world = false) const {
    const GlooGroupMaker maker = gloo_group_maker.load();
    if (maker == nullptr) {
      throw std::runtime_error(
          "no Gloo group maker is installed: a rank process makes its c10d groups through "
          "gradnorm::python (gradnorm::tools::run_command_line installs it)");
    }
    GlooGroupRequest request;
    request.store = store;
    request.rank = rank;
    request.size = size;
    request.timeout = options_.timeout;
    request.world = world;
    ProcessGroupBackend backend;
    backend.group = maker(request);
    backend.name = "gloo";
    backend.widen_bfloat16 = true;
    return backend;
  }

  static std::string failed_key(int rank) { return fmt::format("gradnorm/failed/{}", rank); }
  static std::string done_key(int rank) { return fmt::format("gradnorm/done/{}", rank); }
  static std::string abort_key() { return "gradnorm/abort"; }
  static std::string alive_key(int rank) { return fmt::format("gradnorm/alive/{}", rank); }
  static std::vector<std::uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }
  static std::string text(const std::vector<std::uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }
  static std::chrono::milliseconds watchdog_period() { return std::chrono::milliseconds(200); }

  // A thread on a store connection of its own (a TCPStore client is not shared between
  // threads) that ends this process when a peer gave up on the run, or when the store went
  // away: so a rank stuck in its step, or in a collective a dead peer will never join, ends
  // within the timeout of the rank that noticed, and its launcher sees a non-zero exit.
  void start_watchdog() {
    c10::intrusive_ptr<c10d::Store> store;
    try {
      c10d::TCPStoreOptions tcp;
      tcp.port = static_cast<std::uint16_t>(rendezvous_.master_port);
      tcp.isServer = false;
      tcp.waitWorkers = false;  // no numWorkers: this connection is not counted as a rank
      tcp.timeout = options_.timeout;
      store = c10::make_intrusive<c10d::TCPStore>(rendezvous_.master_addr, tcp);
    } catch (const std::exception& error) {
      throw CommunicationError(
          fmt::format("rank {}: rendezvous failed: {}", rendezvous_.rank, error_text(error)));
    }
    const std::string server = store_server(rendezvous_);
    watchdog_ = std::thread([watch = watch_, store, server, rank = rendezvous_.rank,
                             addr = rendezvous_.master_addr, port = rendezvous_.master_port] {
      while (!watch->stop) {
        std::this_thread::sleep_for(watchdog_period());
        if (watch->stop || watch->leaving) continue;
        std::string why;
        try {
          // A heartbeat the peers read when a step of theirs hangs: this rank's process, host
          // and link are up while it counts.
          store->add(alive_key(rank), 1);
          if (!store->check({abort_key()})) continue;
          why = text(store->get(abort_key()));
        } catch (const std::exception& error) {
          if (watch->stop || watch->leaving) continue;
          why = fmt::format("rank {} lost the rendezvous store at {}:{} ({} serves it, and has gone): {}",
                            rank, addr, port, server, error_text(error));
        }
        if (watch->stop || watch->leaving) continue;
        std::fprintf(stderr, "gradnorm: run aborted: %s\n", why.c_str());
        std::fflush(stderr);
        std::_Exit(3);  // as a rank that failed itself: the launcher must see the failure
      }
      watch->exited = true;
    });
  }

  // Stops the watchdog, waiting for it a few periods: one blocked on a store whose host or
  // link went down (a socket that neither answers nor closes) is left to the process's end.
  void stop_watchdog() {
    watch_->stop = true;
    if (!watchdog_.joinable() || watchdog_.get_id() == std::this_thread::get_id()) return;
    const auto deadline = std::chrono::steady_clock::now() + watchdog_period() * 5;
    while (!watch_->exited && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (watch_->exited) {
      watchdog_.join();
    } else {
      watchdog_.detach();
    }
  }

  // The peers whose heartbeat (the watchdog's alive_key count) did not move in three
  // watchdog periods, among those that neither finished nor said why they left: their process
  // died, or their host or link went down.
  static std::vector<int> unheard(c10d::Store& store, const Rendezvous& rendezvous) {
    std::vector<std::int64_t> before;
    for (int rank = 0; rank < rendezvous.world_size; ++rank) {
      before.push_back(rank == rendezvous.rank ? 0 : store.add(alive_key(rank), 0));
    }
    std::this_thread::sleep_for(watchdog_period() * 3);
    std::vector<int> ranks;
    for (int rank = 0; rank < rendezvous.world_size; ++rank) {
      if (rank == rendezvous.rank || store.check({done_key(rank)}) || store.check({failed_key(rank)})) {
        continue;  // it finished, or said why it left
      }
      if (store.add(alive_key(rank), 0) == before[static_cast<std::size_t>(rank)]) ranks.push_back(rank);
    }
    return ranks;
  }

  std::map<std::vector<int>, ProcessGroupBackend> subgroups_;
  Rendezvous rendezvous_;
  // Shared with the watchdog thread, which may outlive this object: a thread blocked on a
  // store that no longer answers is left behind, holding only what it owns.
  struct WatchdogState {
    std::atomic<bool> stop{false};
    std::atomic<bool> leaving{false};  // this rank aborts or finishes: the watchdog stands down
    std::atomic<bool> exited{false};
  };
  std::shared_ptr<WatchdogState> watch_ = std::make_shared<WatchdogState>();
  std::thread watchdog_;
  RunOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  ProcessGroupBackend backend_;
  long run_index_ = 0;
};

}  // namespace

void set_gloo_group_maker(GlooGroupMaker maker) { gloo_group_maker.store(maker); }

Rendezvous rendezvous_from_environment() {
  if (!optional_env("RANK") && optional_env("SLURM_PROCID")) return rendezvous_from_slurm();
  Rendezvous r;
  r.world_size = integer_env("WORLD_SIZE", 1, 4096);
  r.rank = integer_env("RANK", 0, r.world_size - 1);
  r.local_world_size = optional_integer_env("LOCAL_WORLD_SIZE", 1, r.world_size);
  r.local_rank = optional_integer_env("LOCAL_RANK", 0,
                                      r.local_world_size > 0 ? r.local_world_size - 1 : r.world_size - 1);
  r.group_rank = optional_integer_env("GROUP_RANK", 0, r.world_size - 1);
  // torchrun sets these for every worker; a plain environment sets none of them.
  const auto use_agent_store = optional_env("TORCHELASTIC_USE_AGENT_STORE");
  if (use_agent_store) {
    if (*use_agent_store != "True" && *use_agent_store != "False") {
      throw scenarios::InvalidInput(fmt::format(
          "environment variable TORCHELASTIC_USE_AGENT_STORE='{}': expected True or False (as "
          "torchrun sets it)", *use_agent_store));
    }
    r.agent_store = *use_agent_store == "True";
  }
  if (const auto run_id = optional_env("TORCHELASTIC_RUN_ID")) r.run_id = *run_id;
  if (r.agent_store) {
    r.restart_count = integer_env("TORCHELASTIC_RESTART_COUNT", 0, 1'000'000);
  } else {
    r.restart_count = optional_integer_env("TORCHELASTIC_RESTART_COUNT", 0, 1'000'000, 0);
  }
  if (use_agent_store || !r.run_id.empty() || optional_env("TORCHELASTIC_RESTART_COUNT")) {
    r.launcher = "torchrun";
  }
  const char* store = std::getenv("GRADNORM_STORE");
  if (store != nullptr && *store != '\0') {
    const std::string text = store;
    if (text.rfind("file:", 0) != 0 || text.size() <= 5) {
      throw scenarios::InvalidInput(fmt::format(
          "GRADNORM_STORE='{}': expected file:PATH (a FileStore path every rank can reach)", text));
    }
    if (r.agent_store) {
      throw scenarios::InvalidInput(
          "GRADNORM_STORE and TORCHELASTIC_USE_AGENT_STORE=True name two different stores: "
          "unset GRADNORM_STORE under torchrun");
    }
    r.file_store = text.substr(5);
    // The store's folder must exist before c10d's FileStore opens it there (it failed inside
    // the rank as exit 3): an input error naming the variable.
    const std::filesystem::path folder = std::filesystem::path(r.file_store).parent_path();
    std::error_code error;
    if (!folder.empty() && !std::filesystem::is_directory(folder, error)) {
      throw scenarios::InvalidInput(fmt::format(
          "GRADNORM_STORE='{}': the folder {} does not exist (a FileStore path every rank can reach)",
          text, folder.string()));
    }
    return r;
  }
  r.master_addr = required_env("MASTER_ADDR");
  r.master_port = integer_env("MASTER_PORT", 1, 65535);
  return r;
}

std::string first_slurm_host(const std::string& hostlist) {
  // The first entry ends at the first comma outside brackets; each bracket group in it
  // stands for its first member (the text before its first ',' or '-').
  std::string out;
  bool in_bracket = false;
  bool taking = true;  // inside a bracket: still copying its first member
  for (const char c : hostlist) {
    if (!in_bracket && c == ',') break;
    if (c == '[') {
      if (in_bracket) break;
      in_bracket = true;
      taking = true;
      continue;
    }
    if (c == ']') {
      if (!in_bracket) throw scenarios::InvalidInput(fmt::format("Slurm hostlist '{}': unmatched ']'", hostlist));
      in_bracket = false;
      continue;
    }
    if (in_bracket) {
      if (c == ',' || c == '-') taking = false;
      if (taking) out += c;
      continue;
    }
    out += c;
  }
  const bool spaces = out.find_first_of(" \t\n") != std::string::npos;
  if (in_bracket || out.empty() || spaces) {
    throw scenarios::InvalidInput(fmt::format(
        "Slurm hostlist '{}': expected host names such as node[01-04],gpu7", hostlist));
  }
  return out;
}

Rendezvous rendezvous_from_slurm() {
  Rendezvous r;
  r.launcher = "slurm";
  r.world_size = integer_env("SLURM_NTASKS", 1, 4096);
  r.rank = integer_env("SLURM_PROCID", 0, r.world_size - 1);
  r.local_rank = optional_integer_env("SLURM_LOCALID", 0, r.world_size - 1);
  r.group_rank = optional_integer_env("SLURM_NODEID", 0, r.world_size - 1);
  if (const auto addr = optional_env("MASTER_ADDR")) {
    r.master_addr = *addr;
  } else {
    // Task 0 runs on the step's first node (Slurm's default block distribution).
    const auto step_nodes = optional_env("SLURM_STEP_NODELIST");
    r.master_addr = first_slurm_host(step_nodes ? *step_nodes : required_env("SLURM_JOB_NODELIST"));
  }
  if (optional_env("MASTER_PORT")) {
    r.master_port = integer_env("MASTER_PORT", 1, 65535);
  } else {
    // One port per job, the same on every task without talking: two jobs sharing a node
    // collide only when their ids agree modulo 10000 (set MASTER_PORT then, or for steps of
    // one job that run at the same time).
    const int job = integer_env("SLURM_JOB_ID", 0, 2'147'483'647);
    r.master_port = kSlurmBasePort + job % 10000;
  }
  return r;
}

std::string describe_process_group(const Rendezvous& rendezvous, const std::string& backend) {
  std::string out = fmt::format("{} processes x {}", backend, rendezvous.world_size);
  if (rendezvous.launcher == "torchrun") {
    out += fmt::format(" under torchrun ({}", rendezvous.agent_store ? "agent store" : "rank 0's store");
    if (rendezvous.restart_count > 0) out += fmt::format(", restart {}", rendezvous.restart_count);
    out += ")";
  } else if (rendezvous.launcher == "slurm") {
    out += " under slurm";
  }
  return out;
}

std::unique_ptr<Transport> make_process_group_transport(const Rendezvous& rendezvous,
                                                        RunOptions options,
                                                        const std::string& backend) {
  if (backend != "gloo" && backend != "nccl") {
    throw scenarios::InvalidInput(fmt::format("unknown backend '{}': expected gloo or nccl", backend));
  }
  // For nccl, make_nccl_backend refuses a machine where NCCL cannot run, for this rank's device.
  return std::make_unique<ProcessGroupTransport>(rendezvous, std::move(options), backend);
}

}  // namespace gradnorm::harness
