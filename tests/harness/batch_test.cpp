// Micro-batches built from a scenario: valid counts, the shifted-label rule, determinism.

#include "gradnorm/harness/batch.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <iterator>
#include <ostream>
#include <set>
#include <string>
#include <vector>

namespace {

using gradnorm::harness::derive_seed;
using gradnorm::harness::kIgnoreIndex;
using gradnorm::harness::make_micro_batch;
using gradnorm::harness::make_rank_window;
using gradnorm::harness::MicroBatch;
using gradnorm::scenarios::DType;
using gradnorm::scenarios::MaskPattern;
using gradnorm::scenarios::ModelKind;
using gradnorm::scenarios::Scenario;

constexpr MaskPattern kMasks[] = {MaskPattern::trailing_padding, MaskPattern::prompt_prefix,
                                  MaskPattern::random_holes};

// One rank, one micro-batch holding `count` valid labels.
Scenario one_micro_batch(MaskPattern mask, int count, int batch = 2, int length = 8) {
  Scenario s;
  s.name = "batch-test";
  s.micro_batch_size = batch;
  s.sequence_length = length;
  s.loss_chunks = 1;
  s.mask = mask;
  s.valid_tokens = {{count}};
  s.seed = 42;
  return s;
}

// The labels of `batch` follow the rules: shape [B, T] int64, exactly `count` entries not
// ignored, each in [0, vocab), and position T-1 ignored in every sequence.
testing::AssertionResult labels_follow_rules(const MicroBatch& batch, const Scenario& s,
                                             long count) {
  const at::Tensor& labels = batch.labels;
  if (labels.scalar_type() != at::kLong) {
    return testing::AssertionFailure() << "labels are " << labels.scalar_type();
  }
  if (labels.dim() != 2 || labels.size(0) != s.micro_batch_size ||
      labels.size(1) != s.sequence_length) {
    return testing::AssertionFailure() << "labels have shape " << labels.sizes();
  }
  if (batch.valid_count != count) {
    return testing::AssertionFailure() << "valid_count " << batch.valid_count << ", want " << count;
  }
  auto view = labels.accessor<long, 2>();
  long valid = 0;
  for (long b = 0; b < labels.size(0); ++b) {
    for (long t = 0; t < labels.size(1); ++t) {
      const long label = view[b][t];
      if (label == kIgnoreIndex) continue;
      if (t == labels.size(1) - 1) {
        return testing::AssertionFailure()
               << "sequence " << b << " position " << t << " (the last) holds " << label;
      }
      if (label < 0 || label >= s.vocab_size) {
        return testing::AssertionFailure() << "labels[" << b << "][" << t << "] = " << label
                                           << " outside [0, " << s.vocab_size << ")";
      }
      ++valid;
    }
  }
  if (valid != count) {
    return testing::AssertionFailure() << valid << " labels are valid, want " << count;
  }
  return testing::AssertionSuccess();
}

// Positions of sequence `b` that hold a valid label.
std::vector<long> valid_positions(const at::Tensor& labels, long b) {
  std::vector<long> out;
  auto view = labels.accessor<long, 2>();
  for (long t = 0; t < labels.size(1); ++t) {
    if (view[b][t] != kIgnoreIndex) out.push_back(t);
  }
  return out;
}

TEST(MakeMicroBatch, HoldsTheRequestedCountForEveryMask) {
  for (MaskPattern mask : kMasks) {
    for (int count : {0, 1, 5, 7, 13, 14}) {  // capacity 2 x (8 - 1) = 14
      const Scenario s = one_micro_batch(mask, count);
      const MicroBatch batch = make_micro_batch(s, 0, 0, 0);
      EXPECT_TRUE(labels_follow_rules(batch, s, count))
          << gradnorm::scenarios::to_string(mask) << " count " << count;
    }
  }
}

TEST(MakeMicroBatch, RuleCheckCanFail) {
  const Scenario s = one_micro_batch(MaskPattern::trailing_padding, 5);
  MicroBatch batch = make_micro_batch(s, 0, 0, 0);
  ASSERT_TRUE(labels_follow_rules(batch, s, 5));
  // Negative controls: a wrong count, a label at the last position, a label outside vocab.
  EXPECT_FALSE(labels_follow_rules(batch, s, 6));
  MicroBatch last = batch;
  last.labels = batch.labels.clone();
  last.labels[0][s.sequence_length - 1] = 3;
  last.labels[0][0] = kIgnoreIndex;
  EXPECT_FALSE(labels_follow_rules(last, s, 5));
  MicroBatch outside = batch;
  outside.labels = batch.labels.clone();
  outside.labels[0][0] = s.vocab_size;
  EXPECT_FALSE(labels_follow_rules(outside, s, 5));
}

TEST(MakeMicroBatch, LastPositionIsAlwaysIgnored) {
  for (MaskPattern mask : kMasks) {
    const Scenario s = one_micro_batch(mask, 14);  // full: every usable position is valid
    const MicroBatch batch = make_micro_batch(s, 0, 0, 0);
    const at::Tensor last = batch.labels.select(1, s.sequence_length - 1);
    EXPECT_TRUE(last.eq(kIgnoreIndex).all().item<bool>()) << gradnorm::scenarios::to_string(mask);
    EXPECT_TRUE(batch.labels.narrow(1, 0, s.sequence_length - 1).ne(kIgnoreIndex).all().item<bool>());
  }
}

TEST(MakeMicroBatch, TrailingPaddingFillsAPrefix) {
  const Scenario s = one_micro_batch(MaskPattern::trailing_padding, 7, 2, 8);
  const MicroBatch batch = make_micro_batch(s, 0, 0, 0);
  // 7 tokens over 2 sequences: the first takes 4, the second 3 (count / B, remainder first).
  constexpr std::size_t kExpectedCounts[] = {4, 3};
  for (long b = 0; b < 2; ++b) {
    const auto positions = valid_positions(batch.labels, b);
    ASSERT_EQ(positions.size(), kExpectedCounts[b]) << "sequence " << b;
    for (std::size_t i = 0; i < positions.size(); ++i) {
      EXPECT_EQ(positions[i], static_cast<long>(i)) << "sequence " << b;
    }
  }
}

TEST(MakeMicroBatch, PromptPrefixIsOneContiguousSpanAfterAPrompt) {
  const Scenario s = one_micro_batch(MaskPattern::prompt_prefix, 4, 2, 10);
  const MicroBatch batch = make_micro_batch(s, 0, 0, 0);
  for (long b = 0; b < 2; ++b) {
    const auto positions = valid_positions(batch.labels, b);
    ASSERT_EQ(positions.size(), 2u) << "4 tokens over 2 sequences, sequence " << b;
    EXPECT_GT(positions.front(), 0) << "sequence " << b << " has no masked prompt";
    EXPECT_EQ(positions.back() - positions.front() + 1, static_cast<long>(positions.size()))
        << "sequence " << b << " is not contiguous";
  }
}

TEST(MakeMicroBatch, CausalInputsAreTokenIds) {
  const Scenario s = one_micro_batch(MaskPattern::random_holes, 6);
  const MicroBatch batch = make_micro_batch(s, 0, 0, 0);
  EXPECT_EQ(batch.inputs.scalar_type(), at::kLong);
  EXPECT_EQ(batch.inputs.sizes(), (std::vector<int64_t>{2, 8}));
  EXPECT_GE(batch.inputs.min().item<long>(), 0);
  EXPECT_LT(batch.inputs.max().item<long>(), s.vocab_size);
}

TEST(MakeMicroBatch, SameArgumentsGiveBitIdenticalTensors) {
  for (MaskPattern mask : kMasks) {
    for (ModelKind model : {ModelKind::causal_lm, ModelKind::linear_head}) {
      Scenario s = one_micro_batch(mask, 6);
      s.model = model;
      s.world_size = 2;
      s.accumulation_steps = 2;
      s.valid_tokens = {{6, 3}, {9, 6}};
      const MicroBatch first = make_micro_batch(s, 1, 2, 1);
      const MicroBatch second = make_micro_batch(s, 1, 2, 1);
      EXPECT_TRUE(at::equal(first.inputs, second.inputs));
      EXPECT_TRUE(at::equal(first.labels, second.labels));
      EXPECT_EQ(first.valid_count, second.valid_count);
    }
  }
}

TEST(MakeMicroBatch, DifferentRankStepOrMicroGiveDifferentLabels) {
  Scenario s = one_micro_batch(MaskPattern::random_holes, 10);
  s.world_size = 2;
  s.accumulation_steps = 2;
  s.steps = 2;
  s.valid_tokens = {{10, 10}, {10, 10}};
  const MicroBatch base = make_micro_batch(s, 0, 0, 0);
  EXPECT_FALSE(at::equal(base.labels, make_micro_batch(s, 1, 0, 0).labels)) << "rank";
  EXPECT_FALSE(at::equal(base.labels, make_micro_batch(s, 0, 1, 0).labels)) << "step";
  EXPECT_FALSE(at::equal(base.labels, make_micro_batch(s, 0, 0, 1).labels)) << "micro";
  EXPECT_FALSE(at::equal(base.inputs, make_micro_batch(s, 0, 0, 1).inputs)) << "micro inputs";
  Scenario reseeded = s;
  reseeded.seed = s.seed + 1;
  EXPECT_FALSE(at::equal(base.labels, make_micro_batch(reseeded, 0, 0, 0).labels)) << "seed";
  // Negative control: the very same micro-batch is equal.
  EXPECT_TRUE(at::equal(base.labels, make_micro_batch(s, 0, 0, 0).labels));
}

TEST(MakeMicroBatch, LinearHeadInputsAreFeaturesInTheScenarioDType) {
  for (DType dtype : {DType::float64, DType::float32, DType::bfloat16}) {
    Scenario s = one_micro_batch(MaskPattern::trailing_padding, 5, 3, 6);
    s.model = ModelKind::linear_head;
    s.hidden_size = 4;
    s.lora_rank = 2;
    s.dtype = dtype;
    const MicroBatch batch = make_micro_batch(s, 0, 0, 0);
    EXPECT_EQ(batch.inputs.scalar_type(), gradnorm::harness::scalar_type(dtype))
        << gradnorm::scenarios::to_string(dtype);
    EXPECT_TRUE(at::isFloatingType(batch.inputs.scalar_type()));
    EXPECT_EQ(batch.inputs.sizes(), (std::vector<int64_t>{3, 6, 4}));
    EXPECT_TRUE(labels_follow_rules(batch, s, 5));
    // Not all equal: they are random features.
    EXPECT_GT(batch.inputs.to(at::kDouble).std().item<double>(), 0.0);
  }
}

TEST(ScalarType, MapsEveryDType) {
  EXPECT_EQ(gradnorm::harness::scalar_type(DType::float64), at::kDouble);
  EXPECT_EQ(gradnorm::harness::scalar_type(DType::float32), at::kFloat);
  EXPECT_EQ(gradnorm::harness::scalar_type(DType::bfloat16), at::kBFloat16);
}

TEST(MakeRankWindow, HoldsEveryMicroBatchInOrder) {
  Scenario s = one_micro_batch(MaskPattern::random_holes, 0);
  s.accumulation_steps = 3;
  s.valid_tokens = {{1, 14, 0}};
  const auto window = make_rank_window(s, 0, 0);
  ASSERT_EQ(window.size(), 3U);
  for (int micro = 0; micro < 3; ++micro) {
    const MicroBatch alone = make_micro_batch(s, 0, 0, micro);
    const auto index = static_cast<std::size_t>(micro);
    EXPECT_TRUE(at::equal(window[index].labels, alone.labels)) << micro;
    EXPECT_TRUE(at::equal(window[index].inputs, alone.inputs)) << micro;
    EXPECT_TRUE(labels_follow_rules(window[index], s, s.valid_tokens[0][index])) << micro;
  }
}

TEST(DeriveSeed, DiffersForDifferentPaths) {
  const std::vector<std::uint64_t> seeds{
      derive_seed(0, {}),        derive_seed(0, {0}),       derive_seed(0, {0, 0}),
      derive_seed(0, {0, 0, 0}), derive_seed(0, {0, 0, 1}), derive_seed(0, {0, 1, 0}),
      derive_seed(0, {1, 0, 0}), derive_seed(0, {1, 0}),    derive_seed(0, {0, 1}),
      derive_seed(7, {3, 2, 1}), derive_seed(7, {1, 2, 3}), derive_seed(7, {3, 2})};
  const std::set<std::uint64_t> unique(seeds.begin(), seeds.end());
  EXPECT_EQ(unique.size(), seeds.size());
  // Negative control: the same path gives the same seed.
  EXPECT_EQ(derive_seed(7, {3, 2, 1}), derive_seed(7, {3, 2, 1}));
}

// "separate streams never overlap" (batch.hpp): a stream is a (base, path) pair, so two
// scenarios with different seeds must not share a micro-batch stream at any rank.
TEST(DeriveSeed, DifferentBasesNeverShareAStream) {
  EXPECT_NE(derive_seed(0, {0, 0, 0}), derive_seed(1, {0, 0, 0}));
  EXPECT_NE(derive_seed(1, {0, 0, 0}), derive_seed(2, {1, 0, 0}))
      << "seed 1 rank 0 and seed 2 rank 1 share a stream";
  EXPECT_NE(derive_seed(5, {4, 3, 2}), derive_seed(9, {8, 3, 2}))
      << "seed 5 rank 4 and seed 9 rank 8 share a stream";
  EXPECT_NE(derive_seed(1, {0, 0, 0}), derive_seed(0, {0, 0}))
      << "a 3-index path of seed 1 equals a 2-index path of seed 0";
}

TEST(MakeMicroBatch, ScenariosWithDifferentSeedsDoNotShareMicroBatches) {
  Scenario one = one_micro_batch(MaskPattern::random_holes, 10);
  one.world_size = 2;
  one.valid_tokens = {{10}, {10}};
  one.seed = 1;
  Scenario two = one;
  two.seed = 2;
  // Negative control: same rank, different seeds.
  EXPECT_FALSE(at::equal(make_micro_batch(one, 0, 0, 0).labels,
                         make_micro_batch(two, 0, 0, 0).labels));
  EXPECT_FALSE(at::equal(make_micro_batch(one, 0, 0, 0).labels,
                         make_micro_batch(two, 1, 0, 0).labels))
      << "seed 1 rank 0 and seed 2 rank 1 draw the same micro-batch";
}

TEST(DeriveSeed, NeighbouringIndicesDoNotCollide) {
  std::set<std::uint64_t> seen;
  for (std::uint64_t rank = 0; rank < 8; ++rank) {
    for (std::uint64_t step = 0; step < 8; ++step) {
      for (std::uint64_t micro = 0; micro < 8; ++micro) {
        EXPECT_TRUE(seen.insert(derive_seed(1000, {rank, step, micro})).second)
            << rank << "/" << step << "/" << micro;
      }
    }
  }
}

// One micro-batch of random shape, count and mask.
rc::Gen<Scenario> random_micro_batch() {
  return rc::gen::exec([] {
    const int batch = *rc::gen::inRange(1, 5);
    const int length = *rc::gen::inRange(2, 13);
    const int count = *rc::gen::inRange(0, batch * (length - 1) + 1);
    const MaskPattern mask = *rc::gen::elementOf(std::vector<MaskPattern>(
        std::begin(kMasks), std::end(kMasks)));
    Scenario s = one_micro_batch(mask, count, batch, length);
    s.seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 20);
    return s;
  });
}

RC_GTEST_PROP(MakeMicroBatchProperty, CountAndLastPositionRule, ()) {
  const Scenario s = *random_micro_batch();
  const long count = s.valid_tokens[0][0];
  const MicroBatch batch = make_micro_batch(s, 0, 0, 0);
  const testing::AssertionResult rules = labels_follow_rules(batch, s, count);
  if (!rules) RC_FAIL(rules.message());
  RC_ASSERT(batch.labels.ne(kIgnoreIndex).sum().item<long>() == count);
  RC_ASSERT(batch.labels.select(1, s.sequence_length - 1).eq(kIgnoreIndex).all().item<bool>());
}

// One mapping from a scenario's dtype to LibTorch's (harness/dtype.hpp), checked at compile
// time: each dtype its own scalar type.
static_assert(gradnorm::harness::scalar_type(DType::float64) == c10::ScalarType::Double);
static_assert(gradnorm::harness::scalar_type(DType::float32) == c10::ScalarType::Float);
static_assert(gradnorm::harness::scalar_type(DType::bfloat16) == c10::ScalarType::BFloat16);

}  // namespace
