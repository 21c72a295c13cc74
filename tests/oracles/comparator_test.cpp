// ULP distance, tensor-set error metrics, observation comparison and the tolerance policy.

#include "gradnorm/oracles/comparator.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gradnorm/oracles/tolerance.hpp"

namespace {

using gradnorm::harness::NamedTensor;
using gradnorm::harness::Observation;
using gradnorm::harness::StepRecord;
using gradnorm::oracles::compare_observations;
using gradnorm::oracles::compare_tensors;
using gradnorm::oracles::ErrorMetrics;
using gradnorm::oracles::ulp_distance;
using gradnorm::scenarios::DType;

constexpr std::int64_t kMaxUlp = std::numeric_limits<std::int64_t>::max();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

// ---------------------------------------------------------------------------------------
// ulp_distance

TEST(UlpDistance, AdjacentFloat32ValuesAreOneApart) {
  for (float x : {1.0f, 0.1f, -3.5f, 1e-30f, 6.5e4f, std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::denorm_min(), 0.0f}) {
    const float up = std::nextafter(x, std::numeric_limits<float>::infinity());
    EXPECT_EQ(ulp_distance(x, up, at::kFloat), 1) << x;
    EXPECT_EQ(ulp_distance(up, x, at::kFloat), 1) << x;
    EXPECT_EQ(ulp_distance(x, x, at::kFloat), 0) << x;
  }
  // Negative control: 1 and 1.5 are 2^22 float32 steps apart, not 1.
  EXPECT_EQ(ulp_distance(1.0, 1.5, at::kFloat), std::int64_t{1} << 22);
}

TEST(UlpDistance, AdjacentFloat64ValuesAreOneApart) {
  for (double x : {1.0, 0.1, -3.5, 1e-300, 1e300, std::numeric_limits<double>::denorm_min()}) {
    const double up = std::nextafter(x, kInf);
    EXPECT_EQ(ulp_distance(x, up, at::kDouble), 1) << x;
    EXPECT_EQ(ulp_distance(up, x, at::kDouble), 1) << x;
  }
  // Negative control: in float32 those two doubles round to the same value.
  EXPECT_EQ(ulp_distance(1.0, std::nextafter(1.0, 2.0), at::kFloat), 0);
  EXPECT_EQ(ulp_distance(1.0, 1.5, at::kDouble), std::int64_t{1} << 51);
}

TEST(UlpDistance, AdjacentBFloat16ValuesAreOneApart) {
  EXPECT_EQ(ulp_distance(1.0, 1.0078125, at::kBFloat16), 1);
  EXPECT_EQ(ulp_distance(-1.0, -1.0078125, at::kBFloat16), 1);
  EXPECT_EQ(ulp_distance(2.0, 2.015625, at::kBFloat16), 1);
  EXPECT_EQ(ulp_distance(1.0, 1.015625, at::kBFloat16), 2);
  // Both values are rounded to bfloat16 first: 1.001 is stored as 1.
  EXPECT_EQ(ulp_distance(1.0, 1.001, at::kBFloat16), 0);
  // Negative control: the same pair is far apart in float32.
  EXPECT_EQ(ulp_distance(1.0, 1.0078125, at::kFloat), std::int64_t{1} << 16);
}

TEST(UlpDistance, SignedZerosAreEqual) {
  for (auto dtype : {at::kDouble, at::kFloat, at::kBFloat16}) {
    EXPECT_EQ(ulp_distance(0.0, -0.0, dtype), 0) << dtype;
    EXPECT_EQ(ulp_distance(-0.0, 0.0, dtype), 0) << dtype;
  }
}

TEST(UlpDistance, OppositeSignsCountThroughZero) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(ulp_distance(tiny, -tiny, at::kFloat), 2);
  EXPECT_EQ(ulp_distance(-tiny, 0.0, at::kFloat), 1);
  const double tiny64 = std::numeric_limits<double>::denorm_min();
  EXPECT_EQ(ulp_distance(tiny64, -tiny64, at::kDouble), 2);
  // 1.0f is 0x3f800000 steps above zero; -1.0f as many below.
  EXPECT_EQ(ulp_distance(1.0, -1.0, at::kFloat), 2 * std::int64_t{0x3f800000});
  EXPECT_EQ(ulp_distance(-1.0, 1.0, at::kBFloat16), 2 * std::int64_t{0x3f80});
  // Negative control: a float64 denormal is zero in float32.
  EXPECT_EQ(ulp_distance(tiny64, -tiny64, at::kFloat), 0);
}

TEST(UlpDistance, NaNIsAsFarAsPossible) {
  for (auto dtype : {at::kDouble, at::kFloat, at::kBFloat16}) {
    EXPECT_EQ(ulp_distance(kNaN, 1.0, dtype), kMaxUlp) << dtype;
    EXPECT_EQ(ulp_distance(1.0, kNaN, dtype), kMaxUlp) << dtype;
    EXPECT_EQ(ulp_distance(kNaN, kNaN, dtype), kMaxUlp) << dtype;
  }
}

TEST(UlpDistance, SaturatesForHugeOppositeFloat64) {
  const double big = std::numeric_limits<double>::max();
  EXPECT_EQ(ulp_distance(big, -big, at::kDouble), kMaxUlp);
  // Infinity is one step above the largest finite value.
  EXPECT_EQ(ulp_distance(big, kInf, at::kDouble), 1);
  EXPECT_EQ(ulp_distance(std::numeric_limits<float>::max(), kInf, at::kFloat), 1);
}

RC_GTEST_PROP(UlpDistanceProperty, NextFloat32IsOneStepAway, ()) {
  const auto bits = *rc::gen::arbitrary<std::uint32_t>();
  const float x = std::bit_cast<float>(bits);
  RC_PRE(std::isfinite(x) && x != std::numeric_limits<float>::max());
  const float up = std::nextafter(x, std::numeric_limits<float>::infinity());
  RC_ASSERT(ulp_distance(x, up, at::kFloat) == 1);
  RC_ASSERT(ulp_distance(up, x, at::kFloat) == 1);
}

// ---------------------------------------------------------------------------------------
// compare_tensors

TEST(CompareTensors, IdenticalTensorsHaveNoError) {
  const std::vector<NamedTensor> a{{"w", at::tensor({3.0f, 4.0f, -1.5f})},
                                   {"b", at::tensor({0.25f})}};
  const std::vector<NamedTensor> b{{"w", at::tensor({3.0f, 4.0f, -1.5f})},
                                   {"b", at::tensor({0.25f})}};
  const ErrorMetrics m = compare_tensors(a, b, at::kFloat);
  EXPECT_EQ(m.max_abs_error, 0.0);
  EXPECT_EQ(m.rel_l2_error, 0.0);
  EXPECT_EQ(m.max_ulp, 0);
  EXPECT_DOUBLE_EQ(m.cosine, 1.0);
  EXPECT_TRUE(m.all_finite);
  EXPECT_TRUE(m.complete);
}

TEST(CompareTensors, KnownPerturbationGivesTheHandComputedErrors) {
  // expected (3, 4) has norm 5; actual (3, 4.5) differs by (0, 0.5): rel L2 0.5 / 5 = 0.1.
  const std::vector<NamedTensor> actual{{"w", at::tensor({3.0f, 4.5f})}};
  const std::vector<NamedTensor> expected{{"w", at::tensor({3.0, 4.0})}};  // wider dtype
  const ErrorMetrics m = compare_tensors(actual, expected, at::kFloat);
  EXPECT_DOUBLE_EQ(m.rel_l2_error, 0.1);
  EXPECT_DOUBLE_EQ(m.max_abs_error, 0.5);
  // 4 -> 4.5 in float32: 0.5 / 2^-21 = 2^20 steps.
  EXPECT_EQ(m.max_ulp, std::int64_t{1} << 20);
  // cos = (3*3 + 4.5*4) / (sqrt(3^2 + 4.5^2) * 5)
  EXPECT_DOUBLE_EQ(m.cosine, 27.0 / (std::sqrt(29.25) * 5.0));
  EXPECT_LT(m.cosine, 1.0);
  EXPECT_TRUE(contains(m.worst, "w[1]")) << m.worst;
  EXPECT_TRUE(contains(m.worst, "4.5")) << m.worst;
  EXPECT_TRUE(m.all_finite);
  EXPECT_TRUE(m.complete);
}

TEST(CompareTensors, RelativeErrorIsOverTheWholeSet) {
  // Flattened expected (3, 4, 12) has norm 13; the only difference is 0.5.
  const std::vector<NamedTensor> actual{{"w", at::tensor({3.0f, 4.5f})},
                                        {"b", at::tensor({12.0f})}};
  const std::vector<NamedTensor> expected{{"w", at::tensor({3.0f, 4.0f})},
                                          {"b", at::tensor({12.0f})}};
  const ErrorMetrics m = compare_tensors(actual, expected, at::kFloat);
  EXPECT_DOUBLE_EQ(m.rel_l2_error, 0.5 / 13.0);
  EXPECT_TRUE(contains(m.worst, "w[1]")) << m.worst;
}

TEST(CompareTensors, ZeroExpectedAgainstNonZeroIsInfinitelyWrong) {
  const std::vector<NamedTensor> zeros{{"w", at::zeros({3}, at::kFloat)}};
  const std::vector<NamedTensor> ones{{"w", at::ones({3}, at::kFloat)}};
  const ErrorMetrics wrong = compare_tensors(ones, zeros, at::kFloat);
  EXPECT_TRUE(std::isinf(wrong.rel_l2_error));
  EXPECT_EQ(wrong.cosine, 0.0);
  // Negative control: zero against zero counts as exact.
  const ErrorMetrics exact = compare_tensors(zeros, zeros, at::kFloat);
  EXPECT_EQ(exact.rel_l2_error, 0.0);
  EXPECT_EQ(exact.cosine, 1.0);
}

TEST(CompareTensors, MissingActualIsIncomplete) {
  const std::vector<NamedTensor> actual{{"head.weight", at::Tensor()}};
  const std::vector<NamedTensor> expected{{"head.weight", at::tensor({3.0f, -4.0f})}};
  const ErrorMetrics m = compare_tensors(actual, expected, at::kFloat);
  EXPECT_FALSE(m.complete);
  EXPECT_EQ(m.max_ulp, kMaxUlp);
  EXPECT_DOUBLE_EQ(m.max_abs_error, 4.0);
  EXPECT_DOUBLE_EQ(m.rel_l2_error, 1.0);
  EXPECT_TRUE(contains(m.worst, "head.weight")) << m.worst;
  EXPECT_TRUE(contains(m.worst, "missing")) << m.worst;
  // Negative control: the same tensor present is complete.
  EXPECT_TRUE(compare_tensors(expected, expected, at::kFloat).complete);
}

TEST(CompareTensors, NaNElementIsNotFiniteAndNamed) {
  const std::vector<NamedTensor> actual{{"head.weight", at::tensor({1.0f, NAN})}};
  const std::vector<NamedTensor> expected{{"head.weight", at::tensor({1.0f, 2.0f})}};
  const ErrorMetrics m = compare_tensors(actual, expected, at::kFloat);
  EXPECT_FALSE(m.all_finite);
  EXPECT_TRUE(m.complete);
  EXPECT_TRUE(std::isnan(m.rel_l2_error));
  EXPECT_EQ(m.max_ulp, kMaxUlp);
  EXPECT_TRUE(contains(m.worst, "head.weight[1]")) << m.worst;
  // Negative control: the finite twin is finite.
  EXPECT_TRUE(compare_tensors(expected, expected, at::kFloat).all_finite);
}

TEST(CompareTensors, NaNOutranksALargerFiniteError) {
  const std::vector<NamedTensor> actual{{"embed", at::tensor({1.0f, 102.0f})},
                                        {"head.bias", at::tensor({NAN})}};
  const std::vector<NamedTensor> expected{{"embed", at::tensor({1.0f, 2.0f})},
                                          {"head.bias", at::tensor({0.5f})}};
  const ErrorMetrics m = compare_tensors(actual, expected, at::kFloat);
  EXPECT_FALSE(m.all_finite);
  EXPECT_TRUE(contains(m.worst, "head.bias")) << m.worst;
}

TEST(CompareTensors, InfinityIsNotFinite) {
  const std::vector<NamedTensor> actual{{"w", at::tensor({1.0f, INFINITY})}};
  const std::vector<NamedTensor> expected{{"w", at::tensor({1.0f, 2.0f})}};
  const ErrorMetrics m = compare_tensors(actual, expected, at::kFloat);
  EXPECT_FALSE(m.all_finite);
  EXPECT_TRUE(contains(m.worst, "w[1]")) << m.worst;
}

TEST(ErrorMetricsMerge, KeepsTheWorstOfEach) {
  ErrorMetrics a;
  a.max_abs_error = 0.1;
  a.rel_l2_error = 0.01;
  a.max_ulp = 3;
  a.cosine = 0.99;
  a.worst = "a[0]";
  ErrorMetrics b;
  b.max_abs_error = 0.2;
  b.rel_l2_error = 0.005;
  b.max_ulp = 10;
  b.cosine = 0.995;
  b.all_finite = false;
  b.worst = "b[1]";
  a.merge(b);
  EXPECT_EQ(a.max_abs_error, 0.2);
  EXPECT_EQ(a.worst, "b[1]");
  EXPECT_EQ(a.rel_l2_error, 0.01);
  EXPECT_EQ(a.max_ulp, 10);
  EXPECT_EQ(a.cosine, 0.99);
  EXPECT_FALSE(a.all_finite);
  EXPECT_TRUE(a.complete);

  // Negative control: merging a better comparison changes nothing.
  const ErrorMetrics before = a;
  a.merge(ErrorMetrics{});
  EXPECT_EQ(a.max_abs_error, before.max_abs_error);
  EXPECT_EQ(a.worst, before.worst);
  EXPECT_EQ(a.rel_l2_error, before.rel_l2_error);
  EXPECT_EQ(a.max_ulp, before.max_ulp);
  EXPECT_EQ(a.cosine, before.cosine);
  EXPECT_EQ(a.all_finite, before.all_finite);
  EXPECT_EQ(a.complete, before.complete);
}

TEST(ErrorMetricsMerge, NaNAndIncompleteAreSticky) {
  ErrorMetrics a;
  ErrorMetrics nan;
  nan.max_abs_error = kNaN;
  nan.rel_l2_error = kNaN;
  nan.cosine = kNaN;
  nan.complete = false;
  nan.worst = "x[0]: got nan";
  a.merge(nan);
  ErrorMetrics finite;
  finite.max_abs_error = 5.0;
  finite.rel_l2_error = 5.0;
  finite.cosine = -1.0;
  finite.worst = "y[0]";
  a.merge(finite);
  EXPECT_TRUE(std::isnan(a.max_abs_error));
  EXPECT_EQ(a.worst, "x[0]: got nan");
  EXPECT_TRUE(std::isnan(a.rel_l2_error));
  EXPECT_TRUE(std::isnan(a.cosine));
  EXPECT_FALSE(a.complete);
}

// ---------------------------------------------------------------------------------------
// compare_observations

// Two steps of a two-parameter model; every call builds fresh tensors.
Observation make_observation() {
  Observation o;
  o.scenario = "single/n5/float32";
  o.variant = "baseline";
  o.initial_parameters = {{"head.weight", at::tensor({1.0f, 2.0f})},
                          {"head.bias", at::tensor({0.0f})}};
  for (int step = 0; step < 2; ++step) {
    StepRecord record;
    const float shift = static_cast<float>(step) * 0.5f;
    record.gradients = {{"head.weight", at::tensor({0.5f + shift, -0.25f})},
                        {"head.bias", at::tensor({0.125f})}};
    record.grad_norm = 0.57282196186948;
    record.logged_loss = 2.302585092994046 - step;
    record.parameters_after = {{"head.weight", at::tensor({0.75f - shift, 2.125f})},
                               {"head.bias", at::tensor({-0.0625f})}};
    o.steps.push_back(record);
  }
  return o;
}

// Moves element `index` of a float tensor one float32 step up, in a fresh copy.
at::Tensor one_ulp_up(const at::Tensor& tensor, long index) {
  at::Tensor copy = tensor.clone();
  float* data = copy.data_ptr<float>();
  data[index] = std::nextafter(data[index], std::numeric_limits<float>::infinity());
  return copy;
}

TEST(CompareObservations, IdenticalObservationsAreBitwiseEqual) {
  const auto result = compare_observations(make_observation(), make_observation(), at::kFloat);
  EXPECT_TRUE(result.comparable);
  EXPECT_TRUE(result.bitwise_equal);
  EXPECT_TRUE(result.first_difference.empty()) << result.first_difference;
  EXPECT_EQ(result.max_ulp, 0);
  EXPECT_EQ(result.max_abs_error, 0.0);
  EXPECT_EQ(result.gradient_rel_l2, 0.0);
}

TEST(CompareObservations, OneUlpOfLoggedLossIsADifference) {
  Observation a = make_observation();
  Observation b = make_observation();
  b.steps[1].logged_loss = std::nextafter(*a.steps[1].logged_loss, kInf);
  const auto result = compare_observations(a, b, at::kFloat);
  EXPECT_TRUE(result.comparable);
  EXPECT_FALSE(result.bitwise_equal);
  EXPECT_TRUE(contains(result.first_difference, "logged loss")) << result.first_difference;
  EXPECT_TRUE(contains(result.first_difference, "step 1")) << result.first_difference;
}

TEST(CompareObservations, SignedZeroLossIsADifferentBitPattern) {
  Observation a = make_observation();
  Observation b = make_observation();
  a.steps[0].logged_loss = 0.0;
  b.steps[0].logged_loss = -0.0;
  const auto result = compare_observations(a, b, at::kFloat);
  EXPECT_FALSE(result.bitwise_equal);
  EXPECT_TRUE(contains(result.first_difference, "logged loss")) << result.first_difference;
}

TEST(CompareObservations, MissingGradNormIsADifference) {
  Observation a = make_observation();
  Observation b = make_observation();
  b.steps[0].grad_norm.reset();
  const auto result = compare_observations(a, b, at::kFloat);
  EXPECT_FALSE(result.bitwise_equal);
  EXPECT_TRUE(contains(result.first_difference, "grad norm")) << result.first_difference;
}

TEST(CompareObservations, OneUlpOfGradientIsADifference) {
  Observation a = make_observation();
  Observation b = make_observation();
  b.steps[0].gradients[1].value = one_ulp_up(b.steps[0].gradients[1].value, 0);
  const auto result = compare_observations(a, b, at::kFloat);
  EXPECT_TRUE(result.comparable);
  EXPECT_FALSE(result.bitwise_equal);
  EXPECT_TRUE(contains(result.first_difference, "step 0")) << result.first_difference;
  EXPECT_TRUE(contains(result.first_difference, "head.bias gradient")) << result.first_difference;
  EXPECT_EQ(result.max_ulp, 1);
  EXPECT_GT(result.gradient_rel_l2, 0.0);
}

TEST(CompareObservations, OneUlpOfParameterIsADifference) {
  Observation a = make_observation();
  Observation b = make_observation();
  b.steps[1].parameters_after[0].value = one_ulp_up(b.steps[1].parameters_after[0].value, 1);
  const auto result = compare_observations(a, b, at::kFloat);
  EXPECT_FALSE(result.bitwise_equal);
  EXPECT_TRUE(contains(result.first_difference, "head.weight after the step"))
      << result.first_difference;
  EXPECT_EQ(result.max_ulp, 1);
  EXPECT_EQ(result.gradient_rel_l2, 0.0);
}

TEST(CompareObservations, ADifferentDTypeIsADifference) {
  Observation a = make_observation();
  Observation b = make_observation();
  b.steps[0].gradients[0].value = b.steps[0].gradients[0].value.to(at::kDouble);
  const auto result = compare_observations(a, b, at::kFloat);
  EXPECT_FALSE(result.bitwise_equal);
  EXPECT_TRUE(contains(result.first_difference, "head.weight gradient"))
      << result.first_difference;
}

TEST(CompareObservations, UnconsumedGradientOnBothSidesIsEqual) {
  Observation a = make_observation();
  Observation b = make_observation();
  a.steps[0].gradients[0].value = at::Tensor();
  b.steps[0].gradients[0].value = at::Tensor();
  EXPECT_TRUE(compare_observations(a, b, at::kFloat).bitwise_equal);
  // Negative control: consumed on one side only.
  b = make_observation();
  const auto result = compare_observations(a, b, at::kFloat);
  EXPECT_FALSE(result.bitwise_equal);
  EXPECT_TRUE(contains(result.first_difference, "head.weight gradient"))
      << result.first_difference;
}

TEST(CompareObservations, AnErrorOnOneSideIsNotComparable) {
  Observation a = make_observation();
  Observation b = make_observation();
  b.error = gradnorm::harness::ErrorRecord{"c10::Error", "element 0 of tensors does not require grad"};
  const auto result = compare_observations(a, b, at::kFloat);
  EXPECT_FALSE(result.comparable);
  EXPECT_FALSE(result.bitwise_equal);
  EXPECT_FALSE(result.first_difference.empty());
}

TEST(CompareObservations, TheSameErrorOnBothSidesIsEqualButNotComparable) {
  Observation a = make_observation();
  Observation b = make_observation();
  a.error = gradnorm::harness::ErrorRecord{"refusal", "clipping with optimizer in backward"};
  b.error = a.error;
  const auto same = compare_observations(a, b, at::kFloat);
  EXPECT_FALSE(same.comparable);
  EXPECT_TRUE(same.bitwise_equal);
  // Negative control: another message differs.
  b.error->message = "accumulation with optimizer in backward";
  EXPECT_FALSE(compare_observations(a, b, at::kFloat).bitwise_equal);
}

TEST(CompareObservations, StoppingEarlyIsNotComparable) {
  Observation a = make_observation();
  Observation b = make_observation();
  b.steps.pop_back();
  const auto result = compare_observations(a, b, at::kFloat);
  EXPECT_FALSE(result.comparable);
  EXPECT_FALSE(result.bitwise_equal);
}

// ---------------------------------------------------------------------------------------
// tolerance policy

TEST(Tolerance, WiderDTypesAreTighter) {
  using gradnorm::oracles::tolerance_for;
  const auto& f64 = tolerance_for(DType::float64);
  const auto& f32 = tolerance_for(DType::float32);
  const auto& bf16 = tolerance_for(DType::bfloat16);
  EXPECT_LT(f64.tensor_rel_l2, f32.tensor_rel_l2);
  EXPECT_LT(f32.tensor_rel_l2, bf16.tensor_rel_l2);
  EXPECT_LT(f64.scalar_rel, f32.scalar_rel);
  EXPECT_LT(f32.scalar_rel, bf16.scalar_rel);
  for (const auto* tolerance : {&f64, &f32, &bf16}) {
    EXPECT_GT(tolerance->tensor_rel_l2, 0.0);
    EXPECT_GT(tolerance->scalar_rel, 0.0);
    ASSERT_NE(tolerance->reason, nullptr);
    EXPECT_FALSE(std::string(tolerance->reason).empty());
  }
}

TEST(Tolerance, UlpOfOneIsTheMachineEpsilon) {
  using gradnorm::oracles::ulp_of;
  EXPECT_EQ(ulp_of(1.0, DType::float32), std::ldexp(1.0, -23));
  EXPECT_EQ(ulp_of(1.0, DType::float32), static_cast<double>(std::numeric_limits<float>::epsilon()));
  EXPECT_EQ(ulp_of(1.0, DType::float64), std::numeric_limits<double>::epsilon());
  EXPECT_EQ(ulp_of(1.0, DType::bfloat16), 1.0078125 - 1.0);
  // Within a binade the ULP is constant; it doubles at the next power of two.
  EXPECT_EQ(ulp_of(1.75, DType::float32), std::ldexp(1.0, -23));
  EXPECT_EQ(ulp_of(-1.75, DType::float32), std::ldexp(1.0, -23));
  EXPECT_EQ(ulp_of(0.75, DType::float32), std::ldexp(1.0, -24));
  // Negative control: the next binade differs.
  EXPECT_NE(ulp_of(2.0, DType::float32), ulp_of(1.0, DType::float32));
  EXPECT_EQ(ulp_of(2.0, DType::float32), std::ldexp(1.0, -22));
}

TEST(Tolerance, UlpOfAgreesWithNextafterAndUlpDistance) {
  using gradnorm::oracles::ulp_of;
  for (float x : {1.0f, 3.0f, 0.1f, 1234.5f, 1e-20f}) {
    const float up = std::nextafter(x, std::numeric_limits<float>::infinity());
    EXPECT_EQ(ulp_of(x, DType::float32), static_cast<double>(up) - static_cast<double>(x)) << x;
    EXPECT_EQ(ulp_distance(x, x + ulp_of(x, DType::float32), at::kFloat), 1) << x;
  }
  EXPECT_EQ(ulp_distance(3.0, 3.0 + ulp_of(3.0, DType::bfloat16), at::kBFloat16), 1);
}

TEST(Tolerance, UlpOfZeroAndNonFiniteIsZero) {
  using gradnorm::oracles::ulp_of;
  EXPECT_EQ(ulp_of(0.0, DType::float32), 0.0);
  EXPECT_EQ(ulp_of(kInf, DType::float64), 0.0);
  EXPECT_EQ(ulp_of(kNaN, DType::bfloat16), 0.0);
}

}  // namespace
