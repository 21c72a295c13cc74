// Ranks on CUDA devices over raw NCCL, without a CUDA-enabled LibTorch. The model and every
// tensor stay on the CPU; RawNcclProcessGroup copies each tensor to a device buffer, sums it
// with ncclAllReduce and copies it back. libcudart and libnccl are opened with dlopen when a
// rank first asks for them: the build needs only the toolkit's headers (for types and
// constants), so the same gradnorm binary starts, and runs Gloo and threads, where there is
// no CUDA at all. A build without those headers (or with GRADNORM_WITH_NCCL=OFF) gets the
// stubs at the bottom.
#include <fmt/format.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "gradnorm/harness/communicator.hpp"
#include "process_group_backend.hpp"

#ifdef GRADNORM_WITH_NCCL
#include <dlfcn.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>
#endif

namespace gradnorm::harness {

#ifdef GRADNORM_WITH_NCCL

// The per-thread-default-stream API renames these entry points (cudaMemcpyAsync becomes
// cudaMemcpyAsync_ptsz): dlsym must look up the names the header declares.
#if defined(cudaMemcpyAsync) || defined(cudaStreamQuery)
#error "nccl_backend.cpp resolves the CUDA runtime by name: build it without CUDA_API_PER_THREAD_DEFAULT_STREAM"
#endif

#ifndef GRADNORM_CUDART_MAJOR
#define GRADNORM_CUDART_MAJOR (CUDART_VERSION / 1000)
#endif
static_assert(GRADNORM_CUDART_MAJOR == CUDART_VERSION / 1000,
              "GRADNORM_CUDART_MAJOR must name the runtime whose cuda_runtime_api.h is included");
// Where configure found the libraries; tried only after the dynamic loader's own search.
#ifndef GRADNORM_CUDA_LIBRARY_DIR
#define GRADNORM_CUDA_LIBRARY_DIR ""
#endif
#ifndef GRADNORM_NCCL_LIBRARY_DIR
#define GRADNORM_NCCL_LIBRARY_DIR ""
#endif

namespace {

using namespace std::chrono_literals;

// The entry points we call, typed from the headers. Optional ones (newer than NCCL 2.4) stay
// null when the library lacks them.
struct CudaApi {
  decltype(&::cudaGetDeviceCount) GetDeviceCount = nullptr;
  decltype(&::cudaGetErrorString) GetErrorString = nullptr;
  decltype(&::cudaSetDevice) SetDevice = nullptr;
  // cuda_runtime.h adds a template cudaMalloc(T**) for C++: pick the C entry point.
  decltype(static_cast<cudaError_t (*)(void**, size_t)>(&::cudaMalloc)) Malloc = nullptr;
  decltype(&::cudaFree) Free = nullptr;
  decltype(&::cudaStreamCreateWithFlags) StreamCreateWithFlags = nullptr;
  decltype(&::cudaStreamDestroy) StreamDestroy = nullptr;
  decltype(&::cudaStreamQuery) StreamQuery = nullptr;
  decltype(&::cudaMemcpyAsync) MemcpyAsync = nullptr;
};

struct NcclApi {
  decltype(&::ncclGetVersion) GetVersion = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclCommInitRank) CommInitRank = nullptr;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&::ncclCommAbort) CommAbort = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclAllReduce) AllReduce = nullptr;
  decltype(&::ncclCommInitRankConfig) CommInitRankConfig = nullptr;  // NCCL 2.14
  decltype(&::ncclCommFinalize) CommFinalize = nullptr;              // NCCL 2.14
  decltype(&::ncclGetLastError) GetLastError = nullptr;              // NCCL 2.13
};

// The two libraries, opened once per process and never closed: both register exit handlers
// and keep threads that must not outlive their code.
struct Runtime {
  std::optional<std::string> unusable;  // why --backend nccl cannot run here, if it cannot
  CudaApi cuda;
  NcclApi nccl;
  int nccl_version = 0;
  int device_count = 0;
};

// The plain soname first, so LD_LIBRARY_PATH and the loader's cache win; then the folder
// configure saw. On failure, returns every attempt's dlerror.
std::optional<std::string> open_library(const std::string& soname, const char* configured_dir,
                                        void*& handle, std::string& opened) {
  std::vector<std::string> candidates{soname};
  if (configured_dir != nullptr && *configured_dir != '\0') {
    candidates.push_back(fmt::format("{}/{}", configured_dir, soname));
  }
  std::string errors;
  for (const std::string& candidate : candidates) {
    ::dlerror();
    handle = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      opened = candidate;
      return std::nullopt;
    }
    const char* error = ::dlerror();
    errors += fmt::format("{}{}", errors.empty() ? "" : "; ", error ? error : candidate);
  }
  return errors;
}

template <typename Function>
bool resolve(void* handle, const char* name, Function& out) {
  out = reinterpret_cast<Function>(::dlsym(handle, name));
  return out != nullptr;
}

std::string missing_symbol(const std::string& library, const char* name, const char* needs) {
  return fmt::format("--backend nccl: {} has no {} ({} is needed)", library, name, needs);
}

std::string cuda_hint(cudaError_t error) {
  switch (error) {
    case cudaErrorInsufficientDriver:
      return fmt::format(
          " (no usable NVIDIA driver on this machine: none is installed, or it is older than "
          "CUDA {} needs)",
          GRADNORM_CUDART_MAJOR);
    case cudaErrorNoDevice: {
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      return visible != nullptr
                 ? fmt::format(" (the driver shows no GPU; CUDA_VISIBLE_DEVICES='{}')", visible)
                 : std::string(" (the driver shows no GPU)");
    }
    default:
      return "";
  }
}

Runtime load_runtime() {
  const std::string cudart_name = fmt::format("libcudart.so.{}", GRADNORM_CUDART_MAJOR);
  const std::string nccl_name = "libnccl.so.2";
  Runtime rt;
  void* cudart = nullptr;
  std::string cudart_path;
  if (auto error = open_library(cudart_name, GRADNORM_CUDA_LIBRARY_DIR, cudart, cudart_path)) {
    rt.unusable = fmt::format("--backend nccl needs the CUDA runtime {}, which did not load: {}",
                              cudart_name, *error);
    return rt;
  }
  CudaApi& c = rt.cuda;
  const bool cuda_complete =
      resolve(cudart, "cudaGetDeviceCount", c.GetDeviceCount) &&
      resolve(cudart, "cudaGetErrorString", c.GetErrorString) &&
      resolve(cudart, "cudaSetDevice", c.SetDevice) && resolve(cudart, "cudaMalloc", c.Malloc) &&
      resolve(cudart, "cudaFree", c.Free) &&
      resolve(cudart, "cudaStreamCreateWithFlags", c.StreamCreateWithFlags) &&
      resolve(cudart, "cudaStreamDestroy", c.StreamDestroy) &&
      resolve(cudart, "cudaStreamQuery", c.StreamQuery) &&
      resolve(cudart, "cudaMemcpyAsync", c.MemcpyAsync);
  if (!cuda_complete) {
    rt.unusable = fmt::format("--backend nccl: the CUDA runtime {} lacks an entry point: {}",
                              cudart_path, ::dlerror());
    return rt;
  }

  void* nccl = nullptr;
  std::string nccl_path;
  if (auto error = open_library(nccl_name, GRADNORM_NCCL_LIBRARY_DIR, nccl, nccl_path)) {
    rt.unusable = fmt::format(
        "--backend nccl needs NCCL ({}, the CUDA collectives library), which did not load: {}",
        nccl_name, *error);
    return rt;
  }
  NcclApi& n = rt.nccl;
  for (const auto& [name, ok] : std::initializer_list<std::pair<const char*, bool>>{
           {"ncclGetVersion", resolve(nccl, "ncclGetVersion", n.GetVersion)},
           {"ncclGetErrorString", resolve(nccl, "ncclGetErrorString", n.GetErrorString)},
           {"ncclGetUniqueId", resolve(nccl, "ncclGetUniqueId", n.GetUniqueId)},
           {"ncclCommInitRank", resolve(nccl, "ncclCommInitRank", n.CommInitRank)},
           {"ncclCommGetAsyncError", resolve(nccl, "ncclCommGetAsyncError", n.CommGetAsyncError)},
           {"ncclCommAbort", resolve(nccl, "ncclCommAbort", n.CommAbort)},
           {"ncclCommDestroy", resolve(nccl, "ncclCommDestroy", n.CommDestroy)},
           {"ncclAllReduce", resolve(nccl, "ncclAllReduce", n.AllReduce)}}) {
    if (!ok) {
      rt.unusable = missing_symbol(nccl_path, name, "NCCL 2.4 or later");
      return rt;
    }
  }
  resolve(nccl, "ncclCommInitRankConfig", n.CommInitRankConfig);
  resolve(nccl, "ncclCommFinalize", n.CommFinalize);
  resolve(nccl, "ncclGetLastError", n.GetLastError);
  if (n.GetVersion(&rt.nccl_version) != ncclSuccess) rt.nccl_version = 0;
  // Non-blocking communicators (ncclCommInitRankConfig, ncclCommFinalize) arrived in 2.14;
  // an older library gets the blocking ncclCommInitRank and is never handed a config.
  if (rt.nccl_version < NCCL_VERSION(2, 14, 0)) {
    n.CommInitRankConfig = nullptr;
    n.CommFinalize = nullptr;
  }

  int count = 0;
  const cudaError_t counted = c.GetDeviceCount(&count);
  if (counted != cudaSuccess) {
    rt.unusable = fmt::format("--backend nccl needs a CUDA GPU: cudaGetDeviceCount failed: {}{}",
                              c.GetErrorString(counted), cuda_hint(counted));
    return rt;
  }
  if (count <= 0) {
    rt.unusable = fmt::format("--backend nccl needs a CUDA GPU: the CUDA runtime sees none{}",
                              cuda_hint(cudaErrorNoDevice));
    return rt;
  }
  rt.device_count = count;
  return rt;
}

const Runtime& runtime() {
  static const Runtime loaded = load_runtime();  // thread-safe, once per process
  return loaded;
}

// The device a rank reduces on: its local rank as the launcher gave it (LOCAL_RANK from
// torchrun or our supervisor, SLURM_LOCALID under Slurm), else LOCAL_RANK read here (a
// Rendezvous made by hand), else its global rank.
int local_device_index(const Rendezvous& rendezvous) {
  if (rendezvous.local_rank >= 0) return rendezvous.local_rank;
  const char* local = std::getenv("LOCAL_RANK");
  if (local == nullptr || *local == '\0') return rendezvous.rank;
  const std::string text = local;
  try {
    std::size_t used = 0;
    const int value = std::stoi(text, &used);
    if (used == text.size() && value >= 0) return value;
  } catch (const std::logic_error&) {
  }
  throw scenarios::InvalidInput(fmt::format(
      "environment variable LOCAL_RANK='{}': expected a non-negative integer (the index of "
      "this rank's CUDA device)",
      text));
}

std::optional<ncclDataType_t> nccl_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    // Integers too: Communicator::any() all-reduces an int64 flag before every sum.
    case at::kLong: return ncclInt64;
    case at::kInt: return ncclInt32;
    case at::kChar: return ncclInt8;
    case at::kByte: return ncclUint8;
    default: return std::nullopt;
  }
}

ncclRedOp_t nccl_op(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return ncclSum;
    case c10d::ReduceOp::PRODUCT: return ncclProd;
    case c10d::ReduceOp::MIN: return ncclMin;
    case c10d::ReduceOp::MAX: return ncclMax;
    case c10d::ReduceOp::AVG: return ncclAvg;
    default:
      throw scenarios::InvalidInput(fmt::format(
          "the raw NCCL process group reduces with sum, product, min, max or avg, not reduce "
          "op {}",
          static_cast<int>(op.op_)));
  }
}

// The collective ran synchronously inside allreduce()/barrier(): the Work handed back is
// already finished, so wait() returns at once and result() gives the reduced tensors.
class CompletedWork final : public c10d::Work {
 public:
  CompletedWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type), outputs_(std::move(outputs)) {
    finish();
  }
  std::vector<at::Tensor> result() override { return outputs_; }

 private:
  std::vector<at::Tensor> outputs_;
};

class RawNcclProcessGroup final : public c10d::Backend {
 public:
  RawNcclProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                      int device, std::chrono::milliseconds timeout)
      : c10d::Backend(rank, size), rt_(runtime()), device_(device), timeout_(timeout) {
    init();  // c10d's usage logging, which needs getBackendName(), so not in the base ctor
    try {
      connect(*store);
    } catch (...) {
      release();  // the destructor does not run for a half-built object
      throw;
    }
  }

  RawNcclProcessGroup(const RawNcclProcessGroup&) = delete;
  RawNcclProcessGroup& operator=(const RawNcclProcessGroup&) = delete;
  ~RawNcclProcessGroup() override { release(); }

  const std::string getBackendName() const override { return "nccl"; }

  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override {
    const ncclRedOp_t op = nccl_op(opts.reduceOp);
    for (const at::Tensor& tensor : tensors) {
      // Checked before any rank's first transfer, so a bad list fails without a collective.
      if (!tensor.device().is_cpu()) {
        throw scenarios::InvalidInput(fmt::format(
            "the raw NCCL process group stages CPU tensors itself; got one on {}",
            tensor.device().str()));
      }
      if (!nccl_type(tensor.scalar_type())) {
        throw scenarios::InvalidInput(fmt::format(
            "NCCL cannot all-reduce dtype {}: use float32, float64, float16, bfloat16, int64, "
            "int32, int8 or uint8",
            c10::toString(tensor.scalar_type())));
      }
    }
    const std::chrono::milliseconds timeout = timeout_of(opts.timeout);
    std::lock_guard<std::mutex> lock(mutex_);
    for (at::Tensor& tensor : tensors) {
      // contiguous() is the tensor itself when it already is: then the result lands in place.
      at::Tensor host = tensor.contiguous();
      reduce_host_buffer(host.data_ptr(), static_cast<std::size_t>(host.numel()),
                         static_cast<std::size_t>(host.nbytes()), *nccl_type(host.scalar_type()),
                         op, timeout, "all-reduce", /*copy_back=*/true);
      if (!host.is_same(tensor)) {
        at::NoGradGuard no_grad;
        tensor.copy_(host);
      }
    }
    return c10::make_intrusive<CompletedWork>(rank_, c10d::OpType::ALLREDUCE, tensors);
  }

  // A one-int all-reduce: no rank returns before every rank has entered.
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::int32_t one = 1;
    reduce_host_buffer(&one, 1, sizeof one, ncclInt32, ncclSum, timeout_of(opts.timeout),
                       "barrier", /*copy_back=*/false);
    return c10::make_intrusive<CompletedWork>(rank_, c10d::OpType::BARRIER,
                                              std::vector<at::Tensor>{});
  }

 private:
  std::chrono::milliseconds timeout_of(std::chrono::milliseconds requested) const {
    return requested == c10d::kUnsetTimeout ? timeout_ : requested;
  }

  std::string where() const {
    return fmt::format("rank {} of {} on cuda:{}", rank_, size_, device_);
  }

  std::string nccl_error(ncclResult_t result) const {
    std::string text = rt_.nccl.GetErrorString(result);
    if (rt_.nccl.GetLastError != nullptr && comm_ != nullptr) {
      const char* last = rt_.nccl.GetLastError(comm_);
      if (last != nullptr && *last != '\0') text += fmt::format(": {}", last);
    }
    return text;
  }

  // Aborts the communicator (so no peer's kernel waits on us, and ours stops waiting), then
  // throws: every later call fails at once rather than reusing a broken communicator.
  [[noreturn]] void fail(const std::string& message) {
    abort_communicator();
    throw CommunicationError(message);
  }

  void abort_communicator() noexcept {
    if (comm_ != nullptr) {
      rt_.nccl.CommAbort(comm_);
      comm_ = nullptr;
    }
    broken_ = true;
  }

  void check_cuda(cudaError_t error, const char* call, const char* what) {
    if (error != cudaSuccess) {
      fail(fmt::format("NCCL {} of {}: {} failed: {}", what, where(), call,
                       rt_.cuda.GetErrorString(error)));
    }
  }

  void check_nccl(ncclResult_t result, const char* call, const char* what) {
    if (result != ncclSuccess && result != ncclInProgress) {
      fail(fmt::format("NCCL {} of {}: {} failed: {}", what, where(), call, nccl_error(result)));
    }
  }

  void connect(c10d::Store& store) {
    check_cuda(rt_.cuda.SetDevice(device_), "cudaSetDevice", "setup");
    // One id for the whole group, made by rank 0 and passed through the c10d store, whose
    // get() waits for it no longer than the store's timeout.
    ncclUniqueId id{};
    const std::string key = "nccl/unique_id";
    if (rank_ == 0) {
      check_nccl(rt_.nccl.GetUniqueId(&id), "ncclGetUniqueId", "setup");
      const auto* bytes = reinterpret_cast<const std::uint8_t*>(&id);
      store.set(key, std::vector<std::uint8_t>(bytes, bytes + sizeof id));
    } else {
      const std::vector<std::uint8_t> bytes = store.get(key);
      if (bytes.size() != sizeof id) {
        throw CommunicationError(fmt::format(
            "NCCL setup of {}: the store's {} holds {} bytes, not an ncclUniqueId's {}", where(),
            key, bytes.size(), sizeof id));
      }
      std::copy(bytes.begin(), bytes.end(), reinterpret_cast<std::uint8_t*>(&id));
    }
    check_cuda(rt_.cuda.StreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags", "setup");
    grow_buffer(256);

    if (rt_.nccl.CommInitRankConfig == nullptr) {
      // NCCL before 2.14: blocking, so a missing peer is caught only by NCCL's own
      // bootstrap timeout, not ours.
      check_nccl(rt_.nccl.CommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank", "setup");
      return;
    }
    // Non-blocking: the init runs in NCCL's threads while we watch the clock, so a peer that
    // never arrives costs `timeout`, then an abort, not a hang.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    nonblocking_ = true;
    check_nccl(rt_.nccl.CommInitRankConfig(&comm_, size_, id, rank_, &config),
               "ncclCommInitRankConfig", "setup");
    wait_for_communicator("setup", timeout_, /*stream_too=*/false);
  }

  void grow_buffer(std::size_t bytes) {
    if (bytes <= capacity_) return;
    const std::size_t capacity = std::max(bytes, 2 * capacity_);
    if (buffer_ != nullptr) {
      rt_.cuda.Free(buffer_);  // synchronous; the stream is idle between collectives
      buffer_ = nullptr;
      capacity_ = 0;
    }
    check_cuda(rt_.cuda.Malloc(&buffer_, capacity), "cudaMalloc", "staging");
    capacity_ = capacity;
  }

  // Host -> device, in-place ncclAllReduce, device -> host, all on our stream.
  void reduce_host_buffer(void* host, std::size_t count, std::size_t bytes, ncclDataType_t type,
                          ncclRedOp_t op, std::chrono::milliseconds timeout, const char* what,
                          bool copy_back) {
    if (broken_) {
      throw CommunicationError(fmt::format(
          "NCCL {} of {}: the communicator was aborted after an earlier failure", what, where()));
    }
    if (count == 0) return;  // every rank holds the same shapes, so every rank skips it
    // The CUDA runtime's current device is per thread; collectives may come from any thread.
    check_cuda(rt_.cuda.SetDevice(device_), "cudaSetDevice", what);
    grow_buffer(bytes);
    check_cuda(rt_.cuda.MemcpyAsync(buffer_, host, bytes, cudaMemcpyHostToDevice, stream_),
               "cudaMemcpyAsync", what);
    check_nccl(rt_.nccl.AllReduce(buffer_, buffer_, count, type, op, comm_, stream_),
               "ncclAllReduce", what);
    // Wait before copying back: a device-to-pageable copy blocks the thread until it is done,
    // which, behind a collective missing a peer, would be forever.
    wait_for_communicator(what, timeout, /*stream_too=*/true);
    if (copy_back) {
      check_cuda(rt_.cuda.MemcpyAsync(host, buffer_, bytes, cudaMemcpyDeviceToHost, stream_),
                 "cudaMemcpyAsync", what);
      wait_for_communicator(what, timeout, /*stream_too=*/true);
    }
  }

  // Polls the communicator (and the stream) until the work is done, NCCL reports an error,
  // or `timeout` passes. NCCL's kernels wait for a missing peer forever: the deadline is ours.
  void wait_for_communicator(const char* what, std::chrono::milliseconds timeout, bool stream_too) {
    const auto start = std::chrono::steady_clock::now();
    for (long polls = 0;; ++polls) {
      ncclResult_t state = ncclSuccess;
      check_nccl(rt_.nccl.CommGetAsyncError(comm_, &state), "ncclCommGetAsyncError", what);
      if (state != ncclSuccess && state != ncclInProgress) {
        fail(fmt::format("NCCL {} of {} failed: {}", what, where(), nccl_error(state)));
      }
      if (state == ncclSuccess) {
        if (!stream_too) return;
        const cudaError_t done = rt_.cuda.StreamQuery(stream_);
        if (done == cudaSuccess) return;
        if (done != cudaErrorNotReady) check_cuda(done, "cudaStreamQuery", what);
      }
      if (std::chrono::steady_clock::now() - start >= timeout) {
        fail(fmt::format(
            "NCCL {} of {} timed out after {} ms (a peer rank is missing or stuck); the NCCL "
            "communicator was aborted",
            what, where(), timeout.count()));
      }
      // Most collectives here are tiny: spin briefly, then stop burning the core.
      if (polls < 2000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(50us);
      }
    }
  }

  // Finalize and destroy (waiting no longer than the timeout for in-flight work), else abort.
  void release() noexcept {
    if (rt_.cuda.SetDevice != nullptr) rt_.cuda.SetDevice(device_);
    if (comm_ != nullptr) {
      bool finalized = false;
      if (nonblocking_ && rt_.nccl.CommFinalize != nullptr) {
        const ncclResult_t started = rt_.nccl.CommFinalize(comm_);
        const auto start = std::chrono::steady_clock::now();
        while (started == ncclSuccess || started == ncclInProgress) {
          ncclResult_t state = ncclInProgress;
          if (rt_.nccl.CommGetAsyncError(comm_, &state) != ncclSuccess) break;
          if (state == ncclSuccess) {
            finalized = true;
            break;
          }
          if (state != ncclInProgress || std::chrono::steady_clock::now() - start >= timeout_) {
            break;
          }
          std::this_thread::sleep_for(1ms);
        }
      } else {
        finalized = !broken_;  // blocking communicators finalize inside ncclCommDestroy
      }
      if (finalized) {
        rt_.nccl.CommDestroy(comm_);
      } else {
        rt_.nccl.CommAbort(comm_);
      }
      comm_ = nullptr;
    }
    if (buffer_ != nullptr) rt_.cuda.Free(buffer_);
    buffer_ = nullptr;
    capacity_ = 0;
    if (stream_ != nullptr) rt_.cuda.StreamDestroy(stream_);
    stream_ = nullptr;
  }

  const Runtime& rt_;
  const int device_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* buffer_ = nullptr;
  std::size_t capacity_ = 0;
  bool nonblocking_ = false;
  bool broken_ = false;
};

}  // namespace

bool nccl_compiled_in() { return true; }

std::optional<std::string> nccl_unavailable_reason(int local_device_index) {
  const Runtime& rt = runtime();
  if (rt.unusable) return rt.unusable;
  if (local_device_index < 0 || local_device_index >= rt.device_count) {
    return fmt::format(
        "--backend nccl needs CUDA device cuda:{} for this rank (its local rank, from "
        "LOCAL_RANK or SLURM_LOCALID, else its RANK), but this machine has {} (cuda:0..cuda:{}): "
        "run at most {} rank{} per machine",
        local_device_index, rt.device_count, rt.device_count - 1, rt.device_count,
        rt.device_count == 1 ? "" : "s");
  }
  return std::nullopt;
}

ProcessGroupBackend make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                      const Rendezvous& rendezvous,
                                      std::chrono::milliseconds timeout) {
  const int device_index = local_device_index(rendezvous);
  if (auto why = nccl_unavailable_reason(device_index)) throw scenarios::InvalidInput(*why);
  ProcessGroupBackend backend;
  backend.group = c10::make_intrusive<RawNcclProcessGroup>(store, rendezvous.rank,
                                                           rendezvous.world_size, device_index,
                                                           timeout);
  backend.name = "nccl";
  backend.device = at::kCPU;      // the group stages tensors to its device itself
  backend.widen_bfloat16 = false;  // NCCL reduces bfloat16 natively
  return backend;
}

#else

namespace {
constexpr const char* kNotCompiledIn =
    "--backend nccl: this gradnorm was built without NCCL: configure found no CUDA toolkit "
    "headers (nccl.h and cuda_runtime_api.h), or GRADNORM_WITH_NCCL was OFF";
}

bool nccl_compiled_in() { return false; }

std::optional<std::string> nccl_unavailable_reason(int) { return std::string(kNotCompiledIn); }

ProcessGroupBackend make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, const Rendezvous&,
                                      std::chrono::milliseconds) {
  throw scenarios::InvalidInput(kNotCompiledIn);
}

#endif

}  // namespace gradnorm::harness
