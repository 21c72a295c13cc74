// --backend nccl over raw NCCL: where it cannot run (no driver, no GPU, no library) it says
// why in one sentence and make_nccl_backend refuses with that sentence as an input error,
// never a crash; where a GPU is (detected at run time), one rank's all-reduce returns every
// supported dtype bit for bit and refuses the others by name.
#include "process_group_backend.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "gradnorm/harness/communicator.hpp"

namespace gradnorm::harness {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Sets (or unsets, with nullptr) an environment variable for one test, then restores it: the
// device index comes from LOCAL_RANK, which a CI runner may have set for itself.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

Rendezvous one_rank() {
  Rendezvous rendezvous;
  rendezvous.rank = 0;
  rendezvous.world_size = 1;
  return rendezvous;
}

// Same dtype, shape and bytes: NaN equals itself and -0 differs from +0.
::testing::AssertionResult same_bits(const at::Tensor& actual, const at::Tensor& expected) {
  if (actual.scalar_type() != expected.scalar_type() || actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure() << "got " << actual.scalar_type() << actual.sizes()
                                         << ", want " << expected.scalar_type()
                                         << expected.sizes();
  }
  const at::Tensor a = actual.contiguous();
  const at::Tensor e = expected.contiguous();
  const auto bytes = static_cast<std::size_t>(a.nbytes());
  // An empty tensor's data pointer may be null, which memcmp must not be given.
  if (bytes > 0 && std::memcmp(a.data_ptr(), e.data_ptr(), bytes) != 0) {
    return ::testing::AssertionFailure() << "bits differ: got " << a << ", want " << e;
  }
  return ::testing::AssertionSuccess();
}

// Present only where a driver, a GPU and both libraries are.
bool gpu_here() { return !nccl_unavailable_reason(0).has_value(); }

#define SKIP_WITHOUT_GPU()                                                                \
  do {                                                                                    \
    if (auto why = nccl_unavailable_reason(0)) {                                          \
      GTEST_SKIP() << "needs a CUDA GPU with NCCL, and this machine has none: " << *why;  \
    }                                                                                     \
  } while (false)

TEST(NcclBackend, WithoutAGpuTheReasonIsASentenceNamingCuda) {
  const std::optional<std::string> reason = nccl_unavailable_reason(0);
  if (!reason) GTEST_SKIP() << "a CUDA GPU with NCCL is here";
  EXPECT_THAT(*reason, StartsWith("--backend nccl"));
  EXPECT_THAT(*reason, HasSubstr("CUDA"));
  EXPECT_EQ(reason->find('\n'), std::string::npos) << *reason;
  EXPECT_EQ(nccl_unavailable_reason(0), reason) << "the answer is settled once per process";
}

TEST(NcclBackend, ABuildWithoutNcclSaysSo) {
  if (nccl_compiled_in()) GTEST_SKIP() << "this build has raw NCCL compiled in";
  const std::optional<std::string> reason = nccl_unavailable_reason(0);
  ASSERT_TRUE(reason.has_value());
  EXPECT_THAT(*reason, HasSubstr("built without NCCL"));
}

TEST(NcclBackend, WithoutAGpuMakeNcclBackendIsAnInputErrorWithTheReason) {
  const std::optional<std::string> reason = nccl_unavailable_reason(0);
  if (!reason) GTEST_SKIP() << "a CUDA GPU with NCCL is here";
  ScopedEnv local("LOCAL_RANK", nullptr);
  auto store = c10::make_intrusive<c10d::HashStore>();
  try {
    (void)make_nccl_backend(store, one_rank(), 5s);
    FAIL() << "make_nccl_backend returned without a GPU";
  } catch (const scenarios::InvalidInput& error) {
    EXPECT_EQ(std::string(error.what()), *reason);
  }
  // Asking again (a second transport in the same process) neither crashes nor changes.
  EXPECT_THROW((void)make_nccl_backend(store, one_rank(), 5s), scenarios::InvalidInput);
}

TEST(NcclBackend, ADeviceIndexOutsideTheMachineIsRefusedByName) {
  for (int index : {-1, 1 << 20}) {
    const std::optional<std::string> reason = nccl_unavailable_reason(index);
    ASSERT_TRUE(reason.has_value()) << "cuda:" << index << " accepted";
    EXPECT_THAT(*reason, HasSubstr("CUDA"));
    if (gpu_here()) {
      EXPECT_THAT(*reason, HasSubstr(fmt::format("cuda:{}", index)));
    }
  }
}

TEST(NcclBackend, AMalformedLocalRankIsAnInputErrorNamingIt) {
  if (!nccl_compiled_in()) GTEST_SKIP() << "this build has no raw NCCL to pick a device for";
  ScopedEnv local("LOCAL_RANK", "first");
  auto store = c10::make_intrusive<c10d::HashStore>();
  try {
    (void)make_nccl_backend(store, one_rank(), 5s);
    FAIL() << "LOCAL_RANK='first' accepted";
  } catch (const scenarios::InvalidInput& error) {
    EXPECT_THAT(error.what(), HasSubstr("LOCAL_RANK='first'"));
  }
}

TEST(NcclBackend, TheLaunchersLocalRankWinsOverTheVariable) {
  if (!nccl_compiled_in()) GTEST_SKIP() << "this build has no raw NCCL to pick a device for";
  if (gpu_here()) GTEST_SKIP() << "a CUDA GPU is here: the group would form";
  ScopedEnv local("LOCAL_RANK", "first");
  Rendezvous rendezvous = one_rank();
  rendezvous.local_rank = 0;  // as Slurm's SLURM_LOCALID gives it, with LOCAL_RANK stale
  try {
    (void)make_nccl_backend(c10::make_intrusive<c10d::HashStore>(), rendezvous, 5s);
    FAIL() << "make_nccl_backend returned without a GPU";
  } catch (const scenarios::InvalidInput& error) {
    EXPECT_EQ(std::string(error.what()), nccl_unavailable_reason(0).value_or(""));
  }
}

TEST(NcclBackend, OneRankAllReduceReturnsEveryFloatDtypeBitForBit) {
  SKIP_WITHOUT_GPU();
  ScopedEnv local("LOCAL_RANK", nullptr);
  const ProcessGroupBackend backend =
      make_nccl_backend(c10::make_intrusive<c10d::HashStore>(), one_rank(), 30s);
  EXPECT_EQ(backend.name, "nccl");
  EXPECT_EQ(backend.group->getBackendName(), "nccl");
  EXPECT_TRUE(backend.device.is_cpu()) << "the group stages tensors itself";
  EXPECT_FALSE(backend.widen_bfloat16);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor specials =
      at::tensor(std::vector<float>{-0.0f, 1.5f, nan, -std::numeric_limits<float>::infinity(),
                                    std::numeric_limits<float>::denorm_min(), 3e38f});
  std::vector<at::Tensor> cases{
      specials,
      at::linspace(-3, 3, 11, at::kDouble) / 7,
      (at::arange(0, 12, at::kFloat) / 3).to(at::kBFloat16).reshape({3, 4}),
      (at::arange(0, 9, at::kFloat) / 5).to(at::kHalf),
      at::arange(-4, 4, at::kLong),  // Communicator::any()'s flag is an int64 all-reduce
      at::randn({1 << 20}, at::kFloat),  // larger than the first staging buffer
      at::arange(0, 12, at::kDouble).reshape({3, 4}).t(),  // not contiguous
      at::empty({0}, at::kFloat),
  };
  for (const at::Tensor& tensor : cases) {
    const at::Tensor before = tensor.clone();
    std::vector<at::Tensor> one{tensor};
    ASSERT_NO_THROW(backend.group->allreduce(one)->wait(30s)) << tensor.scalar_type();
    EXPECT_TRUE(same_bits(one[0], before)) << tensor.scalar_type() << tensor.sizes();
    EXPECT_TRUE(same_bits(tensor, before)) << "in place, " << tensor.scalar_type();
  }
  EXPECT_NO_THROW(backend.group->barrier()->wait(30s));
}

TEST(NcclBackend, AnUnsupportedDtypeThrowsNamingItAndLeavesTheGroupUsable) {
  SKIP_WITHOUT_GPU();
  ScopedEnv local("LOCAL_RANK", nullptr);
  const ProcessGroupBackend backend =
      make_nccl_backend(c10::make_intrusive<c10d::HashStore>(), one_rank(), 30s);
  for (at::ScalarType type : {at::kShort, at::kBool, at::kComplexFloat}) {
    std::vector<at::Tensor> one{at::zeros({4}, type)};
    try {
      backend.group->allreduce(one)->wait(30s);
      ADD_FAILURE() << type << " was all-reduced";
    } catch (const std::exception& error) {
      EXPECT_THAT(error.what(), HasSubstr(c10::toString(type))) << error.what();
    }
  }
  // Refused before any transfer: the communicator is not broken by it.
  std::vector<at::Tensor> one{at::ones({3}, at::kFloat)};
  EXPECT_NO_THROW(backend.group->allreduce(one)->wait(30s));
  EXPECT_TRUE(same_bits(one[0], at::ones({3}, at::kFloat)));
}

}  // namespace
}  // namespace gradnorm::harness
