// Meshes: where each rank sits, what it sees (tensor-parallel ranks share a batch, context-
// parallel ranks split each sequence), FSDP's average over the ranks of one tensor-parallel
// coordinate, and the optimizer-in-backward factor the catalogue documents, measured.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "gradnorm/harness/batch.hpp"
#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/harness/runner.hpp"
#include "gradnorm/oracles/oracle.hpp"
#include "gradnorm/scenarios/catalogue.hpp"

namespace gradnorm {
namespace {

using scenarios::Scenario;

TEST(Mesh, CoordinatesFollowTorchtunesMeshOrderWithTpFastest) {
  Scenario s;
  s.name = "mesh";
  s.world_size = 16;
  s.dp_replicate = 2;
  s.cp = 2;
  s.tp = 2;
  s.valid_tokens = {{1}, {1}, {1}, {1}};
  ASSERT_EQ(s.data_parallel_size(), 4);
  ASSERT_EQ(s.dp_shard(), 2);
  const scenarios::MeshCoordinates c = s.mesh_coordinates(13);  // 1*8 + 1*4 + 0*2 + 1
  EXPECT_EQ(c.dp_replicate, 1);
  EXPECT_EQ(c.dp_shard, 1);
  EXPECT_EQ(c.cp, 0);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.data_parallel_rank, 3);
  EXPECT_NO_THROW(scenarios::validate(s));
  s.valid_tokens = {{1}, {1}};
  EXPECT_THROW(scenarios::validate(s), scenarios::InvalidInput) << "rows must be dp = 4";
  s.valid_tokens = {{1}, {1}, {1}, {1}};
  s.tp = 3;
  EXPECT_THROW(scenarios::validate(s), scenarios::InvalidInput) << "16 is not a multiple of 12";
}

TEST(Mesh, TensorParallelRanksShareABatchAndContextParallelRanksSplitIt) {
  const Scenario& tp2 = scenarios::find_scenario("dist/tp2/float32");
  EXPECT_TRUE(at::equal(harness::make_mesh_micro_batch(tp2, 0, 0, 0).labels,
                        harness::make_mesh_micro_batch(tp2, 1, 0, 0).labels));
  EXPECT_FALSE(at::equal(harness::make_mesh_micro_batch(tp2, 0, 0, 0).labels,
                         harness::make_mesh_micro_batch(tp2, 2, 0, 0).labels));
  const Scenario& cp2 = scenarios::find_scenario("dist/cp2/float32");
  const harness::MicroBatch whole = harness::make_micro_batch(cp2, 0, 0, 0);
  const harness::MicroBatch first = harness::make_mesh_micro_batch(cp2, 0, 0, 0);
  const harness::MicroBatch second = harness::make_mesh_micro_batch(cp2, 1, 0, 0);
  EXPECT_TRUE(at::equal(first.inputs, whole.inputs)) << "the forward sees the whole sequence";
  EXPECT_EQ(first.valid_count + second.valid_count, whole.valid_count);
  EXPECT_GT(first.valid_count, 0);
  EXPECT_GT(second.valid_count, 0);
  const at::Tensor both = at::where(first.labels.ne(harness::kIgnoreIndex), first.labels, second.labels);
  EXPECT_TRUE(at::equal(both, whole.labels));
}

// The documented dp_degree finding, measured: with tp = 2 or cp = 2 the optimizer-in-backward
// gradients are half the contract's, while the token-sum path is right on the same mesh.
TEST(Mesh, OptimizerInBackwardIsOffByTpTimesCpAndTheTokenSumPathIsNot) {
  harness::DeterminismGuard guard;
  for (const char* name : {"dist/tp2-in-bwd/float64", "dist/cp2-in-bwd/float64"}) {
    const Scenario& s = scenarios::find_scenario(name);
    const harness::VariantSpec& v = harness::find_variant("optimizer-in-backward");
    const oracles::OracleResult oracle = oracles::run_oracle(s, harness::model_config_for(v, s));
    const harness::RankedRun run = harness::run_in_threads(v, s);
    ASSERT_FALSE(run.fault) << *run.fault;
    Scenario plain = s;
    plain.optimizer_in_backward = false;
    const harness::RankedRun token_sums = harness::run_in_threads(harness::find_variant("baseline"), plain);
    for (std::size_t i = 0; i < oracle.steps[0].gradients.size(); ++i) {
      const at::Tensor& want = oracle.steps[0].gradients[i].value;
      const at::Tensor got = run.ranks[0].steps[0].gradients[i].value.to(at::kDouble);
      const at::Tensor sums = token_sums.ranks[0].steps[0].gradients[i].value.to(at::kDouble);
      // float64; the recipes' scales are float32 scalars (2^-24 relative).
      EXPECT_LT(((got * 2 - want).norm() / want.norm()).item<double>(), 1e-6) << name;
      EXPECT_LT(((sums - want).norm() / want.norm()).item<double>(), 1e-6) << name;
    }
  }
}

}  // namespace
}  // namespace gradnorm
