// Models from Python files (model = "python:FILE.py:FUNCTION"): the module a user's function
// returns, trained in the scenario's dtype by every step, judged against the oracle's float64
// copy of the same initial parameters; a file, function or module gradnorm cannot train is an
// input error naming it (python/src/python_model.cpp).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/harness/runner.hpp"
#include "gradnorm/harness/transport.hpp"
#include "gradnorm/oracles/evaluation.hpp"
#include "gradnorm/python/python_step.hpp"
#include "gradnorm/scenarios/catalogue.hpp"
#include "support/model_files.hpp"

namespace gradnorm {
namespace {

using scenarios::InvalidInput;

const std::string kModels = GRADNORM_SOURCE_DIR "/tests/python/models/";
const std::string kExamples = GRADNORM_SOURCE_DIR "/examples/python/";

const std::string kSteps = GRADNORM_SOURCE_DIR "/tests/python/steps/";

// Set before the interpreter starts: the test steps import the shipped transcriptions.
const bool kInstalled = [] {
  python::install_python_models();
  return setenv("PYTHONPATH", kExamples.c_str(), 1) == 0;
}();

scenarios::Scenario python_model(const std::string& base, const std::string& file,
                                 const std::string& function) {
  scenarios::Scenario s = scenarios::find_scenario(base);
  s.name = "pymodel/" + function + "/" + base;
  s.model = scenarios::ModelKind::python;
  s.model_file = file;
  s.model_function = function;
  scenarios::validate(s);
  return s;
}

using testing_support::row_of;
std::string input_error(const scenarios::Scenario& s) { return testing_support::model_input_error(s); }

// The bar: baseline passes on one device and on [5, 3]; skip fails on [5, 3]; the
// scale-pass-dropped negative control is caught everywhere. In each dtype, with the example's
// transformer block (scaled_dot_product_attention) and with a model returning an output with
// .logits (Hugging Face's form).
TEST(PythonModel, TrainedAndJudgedOnOneDeviceAndOnRaggedRanks) {
  ASSERT_TRUE(kInstalled);
  harness::DeterminismGuard guard;
  for (const auto& [file, function] :
       {std::pair{kExamples + "tiny_transformer.py", std::string("tiny_transformer")},
        std::pair{kModels + "models.py", std::string("with_output")}}) {
    for (const char* base : {"single/n5/float64", "single/n5/float32", "single/accum2-ragged/bfloat16",
                             "dist/5-3/float64", "dist/5-3/float32", "dist/5-3/bfloat16"}) {
      const scenarios::Scenario s = python_model(base, file, function);
      const oracles::Evaluation e = oracles::evaluate(
          {s}, {harness::find_variant("baseline"), harness::find_variant("skip"),
                harness::find_variant("broken/scale-pass-dropped")});
      ASSERT_FALSE(e.fault) << *e.fault;
      const auto& baseline = row_of(e, "baseline");
      EXPECT_EQ(baseline.verdict.kind, oracles::VerdictKind::pass)
          << s.name << ": " << (baseline.verdict.reasons.empty() ? "" : baseline.verdict.reasons[0]);
      // Negative control: the oracle judges the module's numbers, it does not wave them through.
      EXPECT_EQ(row_of(e, "broken/scale-pass-dropped").verdict.kind, oracles::VerdictKind::fail) << s.name;
      const bool skip_right = s.world_size == 1;
      EXPECT_EQ(row_of(e, "skip").verdict.kind == oracles::VerdictKind::pass, skip_right) << s.name;
    }
  }
}

// Every rank's model and the oracle's twin start from one build: the same parameters bit for
// bit, converted once; the scenario's seed decides them; a second run is bit-identical.
TEST(PythonModel, ParametersAreTheModulesOwnAndComeFromTheScenarioSeed) {
  ASSERT_TRUE(kInstalled);
  harness::DeterminismGuard guard;
  scenarios::Scenario s = python_model("single/n5/bfloat16", kModels + "models.py", "frozen_embedding");
  const auto model = harness::make_model(s, {scenarios::ModelKind::python, false, false});
  const auto again = harness::make_model(s, {scenarios::ModelKind::python, false, false});
  ASSERT_EQ(model->parameters().size(), 5u);
  EXPECT_EQ(model->parameters()[0].name, "embed.weight");
  EXPECT_FALSE(model->parameters()[0].trainable);  // requires_grad_(False) in the file
  EXPECT_TRUE(model->parameters()[1].trainable);
  for (std::size_t i = 0; i < model->parameters().size(); ++i) {
    const at::Tensor& p = model->parameters()[i].value;
    EXPECT_EQ(p.scalar_type(), at::kBFloat16) << model->parameters()[i].name;
    EXPECT_TRUE(at::equal(p, again->parameters()[i].value));
    EXPECT_FALSE(p.is_same(again->parameters()[i].value));  // each rank its own tensors
  }
  const auto twin = model->converted(at::kDouble);
  EXPECT_TRUE(at::equal(twin->parameters()[1].value, model->parameters()[1].value.to(at::kDouble)));
  s.seed += 1;
  const auto reseeded = harness::make_model(s, {scenarios::ModelKind::python, false, false});
  EXPECT_FALSE(at::equal(reseeded->parameters()[1].value, model->parameters()[1].value));

  scenarios::Scenario steps = python_model("single/n5/float32", kModels + "models.py", "mixer");
  steps.steps = 3;
  const auto first = harness::run_single_device(harness::find_variant("baseline"), steps);
  const auto second = harness::run_single_device(harness::find_variant("baseline"), steps);
  ASSERT_EQ(first.steps.size(), 3u);
  EXPECT_EQ(harness::digest(first), harness::digest(second));
}

// A module that casts its logits to float32 (as torchtune's TransformerDecoder does) is
// judged in bfloat16 and float32; in float64 the oracle's twin would round its logits, so it
// is refused there.
TEST(PythonModel, UpcastLogitsAreJudgedExceptInFloat64) {
  ASSERT_TRUE(kInstalled);
  harness::DeterminismGuard guard;
  const scenarios::Scenario bf16 = python_model("dist/5-3/bfloat16", kModels + "models.py", "upcast_output");
  const oracles::Evaluation e = oracles::evaluate({bf16}, {harness::find_variant("baseline")});
  EXPECT_EQ(row_of(e, "baseline").verdict.kind, oracles::VerdictKind::pass);
  const std::string refused =
      input_error(python_model("single/n5/float64", kModels + "models.py", "upcast_output"));
  EXPECT_NE(refused.find("forward returned float32 logits for float64 parameters; expected float64"),
            std::string::npos) << refused;
}

// A Python step's ctx.model is the user's module itself; the step then trains it bit for bit
// as the C++ baseline does. Negative control: on a built-in model the same check raises.
TEST(PythonModel, APythonStepsCtxModelIsTheUsersModule) {
  ASSERT_TRUE(kInstalled);
  harness::DeterminismGuard guard;
  python::register_python_step(python::PythonVariant{
      "py/user-module", {kSteps + "user_module.py", "step"}, harness::Role::candidate, "baseline", ""});
  const scenarios::Scenario s = python_model("dist/5-3/float32", kExamples + "tiny_transformer.py", "tiny_transformer");
  const auto mine = harness::run_in_threads(harness::find_variant("py/user-module"), s);
  const auto cpp = harness::run_in_threads(harness::find_variant("baseline"), s);
  ASSERT_EQ(mine.ranks.size(), 2u);
  for (std::size_t r = 0; r < mine.ranks.size(); ++r) {
    EXPECT_FALSE(mine.ranks[r].error) << mine.ranks[r].error->message;
    EXPECT_EQ(harness::digest(mine.ranks[r]), harness::digest(cpp.ranks[r])) << "rank " << r;
  }
  const auto built_in = harness::run_in_threads(harness::find_variant("py/user-module"),
                                                scenarios::find_scenario("dist/5-3/float32"));
  ASSERT_TRUE(built_in.ranks[0].error);
  EXPECT_NE(built_in.ranks[0].error->message.find("not the scenario's TinyTransformer"), std::string::npos)
      << built_in.ranks[0].error->message;
}

TEST(PythonModel, LoraQatAndDistillationCannotRunIt) {
  const scenarios::Scenario s = python_model("single/n5/float32", "/nonexistent.py", "f");
  EXPECT_TRUE(harness::not_applicable(harness::find_variant("lora-baseline"), s));
  EXPECT_TRUE(harness::not_applicable(harness::find_variant("qat-baseline"), s));
  EXPECT_FALSE(harness::not_applicable(harness::find_variant("baseline"), s));
  const auto kd = harness::not_applicable(harness::find_variant("kd-distributed"), s);
  ASSERT_TRUE(kd);
  EXPECT_NE(kd->find("a Python-model scenario names none"), std::string::npos) << *kd;
}

TEST(PythonModel, FilesAndModulesItCannotTrainAreInputErrorsNamingThem) {
  ASSERT_TRUE(kInstalled);
  const std::string base = "single/n5/float32";
  const std::string models = kModels + "models.py";
  auto error_of = [&](const std::string& file, const std::string& function) {
    return input_error(python_model(base, file, function));
  };
  auto expect_error = [&](const std::string& file, const std::string& function,
                          const std::string& part) {
    const std::string message = error_of(file, function);
    EXPECT_NE(message.find("model 'python:" + file + ":" + function + "'"), std::string::npos)
        << message;
    EXPECT_NE(message.find(part), std::string::npos) << function << ": " << message;
  };
  expect_error(kModels + "missing.py", "f", "names '" + kModels + "missing.py', which does not exist");
  expect_error(kModels, "f", "which is not a regular file");
  expect_error(kModels + "syntax_error.py", "mixer", "does not load: SyntaxError");
  expect_error(kModels + "syntax_error.py", "mixer", "syntax_error.py:1");
  expect_error(models, "nothere", "defines no function 'nothere'");
  expect_error(models, "not_callable", "'not_callable' is not callable");
  expect_error(models, "raises", "could not be built with vocab_size=11, hidden_size=6, "
                                 "sequence_length=8: ValueError: no such size 6 (at " + models + ":");
  expect_error(models, "no_keywords", "unexpected keyword argument 'vocab_size'");
  expect_error(models, "not_a_module", "returned dict, not a torch.nn.Module");
  expect_error(models, "wrong_shape", "maps token ids [2, 8] to logits [2, 8, 12]; expected [2, 8, 11]");
  expect_error(models, "integer_logits", "forward returned int64 logits for float32 parameters");
  expect_error(models, "integer_parameter", "has parameter 'counts' of type Long");
  expect_error(models, "nothing_trainable", "has no parameter that requires grad");
  // It used to crash the process (SIGSEGV) when the digest read the meta tensor's storage.
  expect_error(models, "meta_parameter", "has parameter 'extra' on the meta device");
  expect_error(models, "forward_raises", "cannot run forward(token ids [2, 8]) with float32 parameters: "
                                         "RuntimeError: this model cannot run (at " + models + ":");
  // Negative control: the same checks accept a good module.
  EXPECT_EQ(error_of(models, "mixer"), "<accepted>");
}

// A module that passes the check on token ids of zeros and then raises on the scenario's
// batches leaves nothing to judge: the run ends with an input error naming it, no verdict.
TEST(PythonModel, AModuleRaisingOnTheScenariosBatchesEndsTheRunAsAnInputError) {
  ASSERT_TRUE(kInstalled);
  harness::DeterminismGuard guard;
  const scenarios::Scenario s = python_model("dist/5-3/float32", kModels + "models.py", "raises_on_real_tokens");
  ASSERT_EQ(input_error(s), "<accepted>");
  try {
    (void)oracles::evaluate({s}, {harness::find_variant("baseline")});
    ADD_FAILURE() << "evaluated";
  } catch (const InvalidInput& error) {
    EXPECT_NE(std::string(error.what()).find("raised in forward on the scenario's batches"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("ValueError: token ids above 0 are not supported (at " +
                                             kModels + "models.py:"),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace gradnorm
