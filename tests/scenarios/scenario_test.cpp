// validate(), the token counts, the enum names and describe() of one scenario.

#include "gradnorm/scenarios/scenario.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

namespace {

using gradnorm::scenarios::DType;
using gradnorm::scenarios::ExpectedVerdict;
using gradnorm::scenarios::InvalidInput;
using gradnorm::scenarios::LossKind;
using gradnorm::scenarios::MaskPattern;
using gradnorm::scenarios::ModelKind;
using gradnorm::scenarios::OptimizerKind;
using gradnorm::scenarios::Scenario;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// The defaults with a name: micro_batch_size 2 x (sequence_length 8 - 1) = 14 positions.
Scenario valid_scenario() {
  Scenario s;
  s.name = "unit";
  return s;
}

// validate() throws InvalidInput whose message holds every one of `fragments`, and leaves
// the scenario as it was.
testing::AssertionResult rejects(const Scenario& scenario,
                                 std::initializer_list<std::string> fragments) {
  const std::string before = gradnorm::scenarios::describe(scenario);
  std::string message;
  try {
    gradnorm::scenarios::validate(scenario);
    return testing::AssertionFailure() << "validate() accepted " << before;
  } catch (const InvalidInput& error) {
    message = error.what();
  }
  if (gradnorm::scenarios::describe(scenario) != before) {
    return testing::AssertionFailure() << "validate() changed the scenario: was " << before;
  }
  for (const std::string& fragment : fragments) {
    if (message.find(fragment) == std::string::npos) {
      return testing::AssertionFailure()
             << "message lacks '" << fragment << "'; message: " << message;
    }
  }
  return testing::AssertionSuccess() << message;
}

TEST(Validate, AcceptsTheDefaultsWithAName) {
  EXPECT_NO_THROW(gradnorm::scenarios::validate(valid_scenario()));
}

TEST(Validate, AcceptsTheBoundaryValues) {
  Scenario s = valid_scenario();
  s.sequence_length = 2;
  s.loss_chunks = 2;
  s.micro_batch_size = 1;
  s.valid_tokens = {{1}};  // capacity 1 x (2 - 1) = 1
  s.lora_rank = s.hidden_size;
  s.momentum = 0.0;
  s.weight_decay = 0.0;
  s.clip_max_norm = 1e-12;
  s.expected_verdicts = {{"*skip", "error-mismatch", "documented"}};
  EXPECT_NO_THROW(gradnorm::scenarios::validate(s));
}

TEST(Validate, RejectsHelperCanFail) {
  // Negative controls for the helper itself: a valid scenario, and a wrong substring.
  EXPECT_FALSE(rejects(valid_scenario(), {"world_size"}));
  Scenario s = valid_scenario();
  s.world_size = 0;
  EXPECT_FALSE(rejects(s, {"accumulation_steps"}));
}

TEST(Validate, RejectsAnEmptyName) {
  Scenario s = valid_scenario();
  s.name.clear();
  EXPECT_TRUE(rejects(s, {"name", "must not be empty"}));
}

TEST(Validate, RejectsWorldSize) {
  Scenario s = valid_scenario();
  s.world_size = 0;
  EXPECT_TRUE(rejects(s, {"scenario 'unit'", "world_size", "got 0"}));
  s.world_size = 4097;
  EXPECT_TRUE(rejects(s, {"world_size", "got 4097"}));
  s.world_size = -3;
  EXPECT_TRUE(rejects(s, {"world_size", "got -3"}));
}

TEST(Validate, RejectsAccumulationSteps) {
  Scenario s = valid_scenario();
  s.accumulation_steps = 0;
  EXPECT_TRUE(rejects(s, {"accumulation_steps", "got 0"}));
  s.accumulation_steps = 1025;
  EXPECT_TRUE(rejects(s, {"accumulation_steps", "got 1025"}));
}

TEST(Validate, RejectsMicroBatchSize) {
  Scenario s = valid_scenario();
  s.micro_batch_size = 0;
  EXPECT_TRUE(rejects(s, {"micro_batch_size", "got 0"}));
  s.micro_batch_size = 4097;
  EXPECT_TRUE(rejects(s, {"micro_batch_size", "got 4097"}));
}

TEST(Validate, RejectsSequenceLength) {
  Scenario s = valid_scenario();
  s.sequence_length = 1;
  EXPECT_TRUE(rejects(s, {"sequence_length", "got 1"}));
  s.sequence_length = 65537;
  EXPECT_TRUE(rejects(s, {"sequence_length", "got 65537"}));
}

TEST(Validate, RejectsVocabSize) {
  Scenario s = valid_scenario();
  s.vocab_size = 1;
  EXPECT_TRUE(rejects(s, {"vocab_size", "got 1"}));
  s.vocab_size = (1 << 20) + 1;
  EXPECT_TRUE(rejects(s, {"vocab_size", "got 1048577"}));
}

TEST(Validate, RejectsHiddenSize) {
  Scenario s = valid_scenario();
  s.hidden_size = 0;
  EXPECT_TRUE(rejects(s, {"hidden_size", "got 0"}));
  s.hidden_size = (1 << 16) + 1;
  EXPECT_TRUE(rejects(s, {"hidden_size", "got 65537"}));
}

TEST(Validate, RejectsLoraRank) {
  Scenario s = valid_scenario();
  s.lora_rank = 0;
  EXPECT_TRUE(rejects(s, {"lora_rank", "got 0"}));
  s.hidden_size = 6;
  s.lora_rank = 7;
  EXPECT_TRUE(rejects(s, {"lora_rank", "hidden_size=6", "got 7"}));
}

TEST(Validate, RejectsLossChunks) {
  Scenario s = valid_scenario();
  s.loss_chunks = 0;
  EXPECT_TRUE(rejects(s, {"loss_chunks", "got 0"}));
  s.sequence_length = 8;
  s.loss_chunks = 9;
  EXPECT_TRUE(rejects(s, {"loss_chunks", "sequence_length=8", "got 9"}));
}

TEST(Validate, RejectsLearningRate) {
  Scenario s = valid_scenario();
  s.learning_rate = kNaN;
  EXPECT_TRUE(rejects(s, {"learning_rate", "got nan"}));
  s.learning_rate = 0.0;
  EXPECT_TRUE(rejects(s, {"learning_rate", "got 0"}));
  s.learning_rate = -0.25;
  EXPECT_TRUE(rejects(s, {"learning_rate", "got -0.25"}));
  s.learning_rate = kInf;
  EXPECT_TRUE(rejects(s, {"learning_rate", "got inf"}));
}

TEST(Validate, RejectsMomentum) {
  Scenario s = valid_scenario();
  s.momentum = 1.0;
  EXPECT_TRUE(rejects(s, {"momentum", "got 1"}));
  s.momentum = -0.5;
  EXPECT_TRUE(rejects(s, {"momentum", "got -0.5"}));
  s.momentum = kNaN;
  EXPECT_TRUE(rejects(s, {"momentum", "got nan"}));
}

TEST(Validate, RejectsWeightDecay) {
  Scenario s = valid_scenario();
  s.weight_decay = -0.125;
  EXPECT_TRUE(rejects(s, {"weight_decay", "got -0.125"}));
  s.weight_decay = kNaN;
  EXPECT_TRUE(rejects(s, {"weight_decay", "got nan"}));
  s.weight_decay = kInf;
  EXPECT_TRUE(rejects(s, {"weight_decay", "got inf"}));
}

// The optimizers scale parameters by these in the parameters' dtype; a value the dtype
// cannot hold failed inside a rank ("cannot be converted to type float without overflow",
// exit 3). Controls: the largest value each dtype holds is accepted, and float64 takes 1e308.
TEST(Validate, RejectsScalesTheParameterDtypeCannotHold) {
  Scenario s = valid_scenario();
  s.learning_rate = 1e308;
  EXPECT_TRUE(rejects(s, {"learning_rate", "float32 holds at most 3.40282e+38"}));
  s.dtype = DType::bfloat16;
  s.learning_rate = 3.4e38;  // within float32, past bfloat16's 3.3895e38
  EXPECT_TRUE(rejects(s, {"learning_rate", "bfloat16 holds at most 3.38953e+38"}));
  s.learning_rate = 3.3895313892515355e38;
  EXPECT_NO_THROW(gradnorm::scenarios::validate(s));
  s.dtype = DType::float32;
  s.learning_rate = 0.5;
  s.weight_decay = 1e39;
  EXPECT_TRUE(rejects(s, {"weight_decay", "float32 holds at most"}));
  s.weight_decay = 1e38;  // each fits, the product 5e37 too
  EXPECT_NO_THROW(gradnorm::scenarios::validate(s));
  s.learning_rate = 100;  // 1e40: AdamW's decay factor overflows
  EXPECT_TRUE(rejects(s, {"weight_decay", "times learning_rate is 1e+40"}));
  s.learning_rate = std::numeric_limits<float>::max();
  s.weight_decay = 0;
  EXPECT_NO_THROW(gradnorm::scenarios::validate(s));
  s.dtype = DType::float64;
  s.learning_rate = 1e308;
  EXPECT_NO_THROW(gradnorm::scenarios::validate(s));
}

// The estimate grows with what the model holds per rank; the figures it must stay above are
// peaks measured by hand (docs/design.md §12), so a change that lowers it below them fails.
TEST(MemoryEstimate, StaysAboveTheMeasuredPeaks) {
  using gradnorm::scenarios::estimate_memory_bytes;
  Scenario s = valid_scenario();
  s.vocab_size = 20000;
  s.hidden_size = 64;  // 2,581,184 parameter elements
  EXPECT_DOUBLE_EQ(gradnorm::scenarios::parameter_elements(s), 2.0 * 20000 * 64 + 64 * 64 + 64 + 20000);
  EXPECT_GT(estimate_memory_bytes(s, 1), 926084.0 * 1024);    // measured: 926,084 KB
  s.dtype = DType::float64;
  EXPECT_GT(estimate_memory_bytes(s, 1), 1308408.0 * 1024);   // measured: 1,308,408 KB
  s.dtype = DType::float32;
  s.world_size = 4;
  s.valid_tokens = {{5}, {3}, {2}, {1}};
  EXPECT_GT(estimate_memory_bytes(s, 4), 2110172.0 * 1024);   // measured: 2,110,172 KB
  // Not wildly above either: within 3x of each, so the budget does not refuse what fits.
  EXPECT_LT(estimate_memory_bytes(s, 4), 3 * 2110172.0 * 1024);
  // One rank in a process holds a quarter of the per-rank share.
  EXPECT_LT(estimate_memory_bytes(s, 1), estimate_memory_bytes(s, 4) / 2);
  Scenario big = valid_scenario();
  big.vocab_size = 1 << 20;
  big.hidden_size = 1 << 16;  // 2^37 elements: far past any machine
  EXPECT_GT(estimate_memory_bytes(big, 1), 1e13);
}

TEST(Validate, AcceptsAZeroClipMaxNorm) {
  Scenario s = valid_scenario();
  s.clip_max_norm = 0.0;  // a recipe's "clip_grad_norm: 0"; what it means is the recipe's
  EXPECT_NO_THROW(validate(s));
}

TEST(Validate, RejectsClipMaxNorm) {
  Scenario s = valid_scenario();
  s.clip_max_norm = -1.5;
  EXPECT_TRUE(rejects(s, {"clip_max_norm", "got -1.5"}));
  s.clip_max_norm = kNaN;
  EXPECT_TRUE(rejects(s, {"clip_max_norm", "got nan"}));
  s.clip_max_norm.reset();
  EXPECT_NO_THROW(gradnorm::scenarios::validate(s));
}

TEST(Validate, RejectsSteps) {
  Scenario s = valid_scenario();
  s.steps = 0;
  EXPECT_TRUE(rejects(s, {"steps", "got 0"}));
  s.steps = 10001;
  EXPECT_TRUE(rejects(s, {"steps", "got 10001"}));
}

TEST(Validate, RejectsAWrongNumberOfRankRows) {
  Scenario s = valid_scenario();
  s.world_size = 2;
  s.valid_tokens = {{5}};
  EXPECT_TRUE(rejects(s, {"valid_tokens", "has 1 rank rows", "world_size is 2"}));
}

TEST(Validate, RejectsAWrongNumberOfMicroBatches) {
  Scenario s = valid_scenario();
  s.world_size = 2;
  s.accumulation_steps = 2;
  s.valid_tokens = {{5, 3}, {4}};
  EXPECT_TRUE(
      rejects(s, {"valid_tokens", "rank 1 has 1 micro-batches", "accumulation_steps is 2"}));
}

TEST(Validate, RejectsANegativeCount) {
  Scenario s = valid_scenario();
  s.accumulation_steps = 2;
  s.valid_tokens = {{5, -1}};
  EXPECT_TRUE(rejects(s, {"valid_tokens", "rank 0 micro-batch 1", "asks for -1"}));
}

TEST(Validate, RejectsACountOverCapacity) {
  Scenario s = valid_scenario();
  s.micro_batch_size = 2;
  s.sequence_length = 8;
  s.valid_tokens = {{15}};
  EXPECT_TRUE(rejects(s, {"valid_tokens", "rank 0 micro-batch 0", "asks for 15",
                          "holds 14 positions"}));
  s.valid_tokens = {{14}};  // exactly the capacity is fine
  EXPECT_NO_THROW(gradnorm::scenarios::validate(s));
}

TEST(Validate, RejectsAnUnknownExpectedVerdict) {
  Scenario s = valid_scenario();
  s.expected_verdicts = {ExpectedVerdict{"*skip", "passed", "a typo"}};
  EXPECT_TRUE(rejects(s, {"expected_verdicts", "'passed'"}));
}

TEST(Validate, RejectsAnExpectedVerdictWithoutPatternOrReason) {
  Scenario s = valid_scenario();
  s.expected_verdicts = {ExpectedVerdict{"", "fail", "why"}};
  EXPECT_TRUE(rejects(s, {"expected_verdicts", "variant pattern"}));
  s.expected_verdicts = {ExpectedVerdict{"*", "fail", ""}};
  EXPECT_TRUE(rejects(s, {"expected_verdicts", "reason"}));
}

TEST(Validate, AcceptsEveryKnownVerdictName) {
  for (const char* verdict : {"pass", "fail", "expected-error", "error-mismatch"}) {
    Scenario s = valid_scenario();
    const bool fails = std::string(verdict) == "fail";
    s.expected_verdicts = {ExpectedVerdict{"*", verdict, "documented",
                                           fails ? std::vector<std::string>{"logged-loss"}
                                                 : std::vector<std::string>{}}};
    EXPECT_NO_THROW(gradnorm::scenarios::validate(s)) << verdict;
  }
}

// A finding names the checks it fails: a fail names some (else a second failure on its row
// could hide behind it), by their names; error-mismatch fails error-behaviour alone; pass
// and expected-error fail none.
TEST(Validate, AFindingNamesTheChecksItFails) {
  Scenario s = valid_scenario();
  s.expected_verdicts = {ExpectedVerdict{"*skip", "fail", "ragged"}};
  EXPECT_TRUE(rejects(s, {"'*skip' is a fail: name the checks it fails"}));
  s.expected_verdicts = {ExpectedVerdict{"*skip", "fail", "ragged", {"gradient"}}};
  EXPECT_TRUE(rejects(s, {"names the check 'gradient'", "gradients, parameter-update"}));
  s.expected_verdicts = {ExpectedVerdict{"*skip", "fail", "ragged", {"error-behaviour"}}};
  EXPECT_TRUE(rejects(s, {"is a fail: name the checks"}));
  s.expected_verdicts = {ExpectedVerdict{"*skip", "error-mismatch", "raises", {"gradients"}}};
  EXPECT_TRUE(rejects(s, {"fails error-behaviour alone"}));
  s.expected_verdicts = {ExpectedVerdict{"*skip", "pass", "fine", {"gradients"}}};
  EXPECT_TRUE(rejects(s, {"is pass, which fails no check"}));
  s.expected_verdicts = {ExpectedVerdict{"*skip", "fail", "ragged", {"gradients", "logged-loss"}},
                         ExpectedVerdict{"x", "error-mismatch", "raises", {"error-behaviour"}}};
  EXPECT_NO_THROW(gradnorm::scenarios::validate(s));
}

TEST(TokenCounts, SumPerRankAndOverall) {
  Scenario s = valid_scenario();
  s.world_size = 2;
  s.accumulation_steps = 3;
  s.valid_tokens = {{1, 2, 3}, {4, 0, 6}};
  EXPECT_EQ(s.rank_token_count(0), 6);
  EXPECT_EQ(s.rank_token_count(1), 10);
  EXPECT_EQ(s.global_token_count(), 16);
  // Negative control: a changed count changes the sums.
  s.valid_tokens[1][1] = 5;
  EXPECT_EQ(s.rank_token_count(1), 15);
  EXPECT_EQ(s.global_token_count(), 21);
}

TEST(TokenCounts, AllMaskedIsZero) {
  Scenario s = valid_scenario();
  s.valid_tokens = {{0}};
  EXPECT_EQ(s.rank_token_count(0), 0);
  EXPECT_EQ(s.global_token_count(), 0);
}

TEST(TokenCounts, CapacityIsBatchTimesUsablePositions) {
  Scenario s = valid_scenario();
  s.micro_batch_size = 3;
  s.sequence_length = 5;
  EXPECT_EQ(s.micro_batch_capacity(), 12);
}

// parse(to_string(v)) == v for every value, and names are distinct.
template <typename Enum, typename Parse>
void expect_round_trip(std::initializer_list<Enum> values, Parse parse) {
  std::vector<std::string> names;
  for (Enum value : values) {
    const std::string name(gradnorm::scenarios::to_string(value));
    EXPECT_EQ(parse(name), value) << name;
    for (const std::string& seen : names) EXPECT_NE(seen, name);
    names.push_back(name);
  }
}

TEST(EnumNames, RoundTripEveryValue) {
  using namespace gradnorm::scenarios;
  expect_round_trip({DType::float64, DType::float32, DType::bfloat16}, parse_dtype);
  expect_round_trip({ModelKind::causal_lm, ModelKind::linear_head, ModelKind::lora},
                    parse_model_kind);
  expect_round_trip({LossKind::mean_ce, LossKind::chunked_ce, LossKind::linear_ce},
                    parse_loss_kind);
  expect_round_trip({OptimizerKind::sgd, OptimizerKind::sgd_momentum, OptimizerKind::adamw},
                    parse_optimizer_kind);
  expect_round_trip(
      {MaskPattern::trailing_padding, MaskPattern::prompt_prefix, MaskPattern::random_holes},
      parse_mask_pattern);
}

TEST(EnumNames, PrintTheDocumentedNames) {
  using gradnorm::scenarios::to_string;
  EXPECT_EQ(to_string(DType::bfloat16), "bfloat16");
  EXPECT_EQ(to_string(ModelKind::linear_head), "linear_head");
  EXPECT_EQ(to_string(LossKind::chunked_ce), "chunked_ce");
  EXPECT_EQ(to_string(OptimizerKind::sgd_momentum), "sgd_momentum");
  EXPECT_EQ(to_string(MaskPattern::random_holes), "random_holes");
}

// `parse` throws InvalidInput naming the bad text and every accepted name.
template <typename Parse>
testing::AssertionResult rejects_name(Parse parse, const std::string& text,
                                      std::initializer_list<std::string> accepted) {
  try {
    (void)parse(text);
    return testing::AssertionFailure() << "'" << text << "' was accepted";
  } catch (const InvalidInput& error) {
    const std::string message = error.what();
    for (const std::string& fragment : accepted) {
      if (message.find(fragment) == std::string::npos) {
        return testing::AssertionFailure() << "message lacks '" << fragment << "': " << message;
      }
    }
    if (message.find("'" + text + "'") == std::string::npos) {
      return testing::AssertionFailure() << "message lacks the text: " << message;
    }
    return testing::AssertionSuccess();
  }
}

TEST(EnumNames, UnknownNamesThrowWithTheAcceptedList) {
  using namespace gradnorm::scenarios;
  EXPECT_TRUE(rejects_name(parse_dtype, "float16", {"float64, float32, bfloat16"}));
  EXPECT_TRUE(rejects_name(parse_model_kind, "gpt", {"causal_lm, linear_head, lora"}));
  EXPECT_TRUE(rejects_name(parse_loss_kind, "mean", {"mean_ce, chunked_ce, linear_ce"}));
  EXPECT_TRUE(rejects_name(parse_optimizer_kind, "adam", {"sgd, sgd_momentum, adamw"}));
  EXPECT_TRUE(rejects_name(parse_mask_pattern, "padding",
                           {"trailing_padding, prompt_prefix, random_holes"}));
  // Case matters and empty text is not a name.
  EXPECT_TRUE(rejects_name(parse_dtype, "Float32", {"float32"}));
  EXPECT_TRUE(rejects_name(parse_mask_pattern, "", {"trailing_padding"}));
  // Negative control: a known name is not rejected.
  EXPECT_FALSE(rejects_name(parse_dtype, "float32", {"float64"}));
}

TEST(Describe, MentionsNameAndCounts) {
  Scenario s = valid_scenario();
  s.name = "ragged-two-ranks";
  s.world_size = 2;
  s.accumulation_steps = 2;
  s.valid_tokens = {{5, 3}, {0, 7}};
  s.dtype = DType::bfloat16;
  s.clip_max_norm = 0.5;
  const std::string text = gradnorm::scenarios::describe(s);
  for (const char* fragment : {"ragged-two-ranks", "W=2", "A=2", "[[5, 3], [0, 7]]",
                               "dtype=bfloat16", "clip=0.5"}) {
    EXPECT_NE(text.find(fragment), std::string::npos) << fragment << " not in " << text;
  }
  // Negative control: another count reads differently.
  Scenario other = s;
  other.valid_tokens[1][0] = 1;
  EXPECT_NE(gradnorm::scenarios::describe(other), text);
  s.clip_max_norm.reset();
  EXPECT_NE(gradnorm::scenarios::describe(s).find("clip=none"), std::string::npos);
}

// A scenario with random shape and counts within capacity.
rc::Gen<Scenario> valid_shapes() {
  return rc::gen::exec([] {
    Scenario s = valid_scenario();
    s.world_size = *rc::gen::inRange(1, 5);
    s.accumulation_steps = *rc::gen::inRange(1, 5);
    s.micro_batch_size = *rc::gen::inRange(1, 5);
    s.sequence_length = *rc::gen::inRange(2, 13);
    s.loss_chunks = 1;
    const int capacity = s.micro_batch_capacity();
    s.valid_tokens.clear();
    for (int rank = 0; rank < s.world_size; ++rank) {
      s.valid_tokens.push_back(*rc::gen::container<std::vector<int>>(
          static_cast<std::size_t>(s.accumulation_steps), rc::gen::inRange(0, capacity + 1)));
    }
    return s;
  });
}

RC_GTEST_PROP(ValidateProperty, CountsWithinCapacityValidateAndSum, ()) {
  const Scenario s = *valid_shapes();
  long sum = 0;
  for (const auto& row : s.valid_tokens) {
    for (int count : row) sum += count;
  }
  try {
    gradnorm::scenarios::validate(s);
  } catch (const InvalidInput& error) {
    RC_FAIL(std::string("rejected a valid scenario: ") + error.what());
  }
  RC_ASSERT(s.global_token_count() == sum);
}

RC_GTEST_PROP(ValidateProperty, CapacityPlusOneIsRejectedNamingValidTokens, ()) {
  Scenario s = *valid_shapes();
  const auto rank = static_cast<std::size_t>(*rc::gen::inRange(0, s.world_size));
  const auto micro = static_cast<std::size_t>(*rc::gen::inRange(0, s.accumulation_steps));
  const int over = s.micro_batch_capacity() + 1;
  s.valid_tokens[rank][micro] = over;
  std::string message;
  try {
    gradnorm::scenarios::validate(s);
  } catch (const InvalidInput& error) {
    message = error.what();
  }
  RC_ASSERT(message.find("valid_tokens") != std::string::npos);
  RC_ASSERT(message.find("asks for " + std::to_string(over)) != std::string::npos);
}

}  // namespace
