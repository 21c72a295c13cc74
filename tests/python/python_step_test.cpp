// Python steps on real LibTorch autograd through the embedded interpreter: the shipped
// transcriptions against their C++ counterparts, bit for bit; and every way a Python step
// can go wrong, recorded or refused with the user's FILE:LINE (docs/design.md §10).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "gradnorm/harness/runner.hpp"
#include "gradnorm/harness/transport.hpp"
#include "gradnorm/oracles/evaluation.hpp"
#include "gradnorm/python/python_step.hpp"
#include "gradnorm/scenarios/catalogue.hpp"

namespace gradnorm {
namespace {

using harness::Observation;
using harness::Role;
using python::PythonVariant;

const std::string kExamples = GRADNORM_SOURCE_DIR "/examples/python/";
const std::string kSteps = GRADNORM_SOURCE_DIR "/tests/python/steps/";

// The test steps import the shipped transcriptions; set before the interpreter starts.
const bool kPythonPath = [] { return setenv("PYTHONPATH", kExamples.c_str(), 1) == 0; }();

// Registered once per process (the registry keeps every variant).
const harness::VariantSpec& python_step(const std::string& name, const std::string& file,
                                        const std::string& findings_of = "",
                                        const std::string& function = "step") {
  static std::map<std::string, bool> registered;
  if (!registered[name]) {
    python::register_python_step(
        PythonVariant{name, {file, function}, Role::candidate, "baseline", findings_of});
    registered[name] = true;
  }
  return harness::find_variant(name);
}

const harness::VariantSpec& py_baseline() {
  return python_step("py/baseline", kExamples + "full_finetune.py", "baseline");
}
const harness::VariantSpec& py_skip() {
  return python_step("py/skip", kExamples + "skip.py", "skip");
}

// Every rank's observation, as digests (every number a user sees, and the error).
std::vector<std::uint64_t> digests(const harness::RankedRun& run) {
  std::vector<std::uint64_t> out;
  for (const Observation& o : run.ranks) out.push_back(harness::digest(o));
  return out;
}

// The transcriptions: on every catalogue scenario they apply to, the Python step and its
// C++ counterpart see bit-identical gradients, parameters, norms, logged losses and errors,
// rank by rank, and reach the same verdict.
TEST(PythonTranscriptions, MatchTheirCppCounterpartsBitForBitOnTheWholeCatalogue) {
  ASSERT_TRUE(kPythonPath);
  const std::vector<std::pair<std::string, const harness::VariantSpec*>> pairs = {
      {"baseline", &py_baseline()}, {"skip", &py_skip()}};
  const auto catalogue = scenarios::catalogue();
  int compared = 0, skipped = 0;
  std::vector<harness::VariantSpec> variants;
  for (const auto& [cpp, py] : pairs) {
    variants.push_back(harness::find_variant(cpp));
    variants.push_back(*py);
  }
  const oracles::Evaluation evaluation = oracles::evaluate(catalogue, variants, {});
  ASSERT_FALSE(evaluation.fault) << *evaluation.fault;
  std::map<std::pair<std::string, std::string>, const oracles::EvaluationRow*> rows;
  for (const oracles::EvaluationRow& row : evaluation.rows) {
    rows[{row.scenario.name, row.variant.name}] = &row;
  }
  for (const scenarios::Scenario& s : catalogue) {
    for (const auto& [cpp, py] : pairs) {
      const auto python_row = rows.find({s.name, py->name});
      if (python_row == rows.end()) {
        ++skipped;  // cannot_run: optimizer in backward
        continue;
      }
      const auto cpp_row = rows.find({s.name, cpp});
      ASSERT_NE(cpp_row, rows.end()) << s.name << " x " << cpp;
      const oracles::EvaluationRow& a = *cpp_row->second;
      const oracles::EvaluationRow& b = *python_row->second;
      EXPECT_EQ(a.verdict.kind, b.verdict.kind) << s.name << ": " << cpp << " vs " << py->name;
      EXPECT_EQ(a.met, b.met) << s.name << ": " << cpp << " vs " << py->name;
      EXPECT_EQ(a.rank_digests, b.rank_digests)
          << s.name << ": " << cpp << " and " << py->name << " differ: "
          << (b.observation.error ? b.observation.error->type + " " + b.observation.error->message : "");
      ++compared;
    }
  }
  // 128 scenarios x 2, less the optimizer-in-backward ones the transcriptions leave out.
  EXPECT_GE(compared, 220);
  EXPECT_GT(skipped, 0);
}

// Negative control for the comparison above: the Python skip is not the C++ baseline.
TEST(PythonTranscriptions, TheComparisonTellsDifferentStepsApart) {
  const scenarios::Scenario s = scenarios::find_scenario(scenarios::catalogue(), "dist/5-3/float32");
  const auto baseline = harness::run_in_threads(harness::find_variant("baseline"), s);
  const auto skip = harness::run_in_threads(py_skip(), s);
  EXPECT_NE(digests(baseline), digests(skip));
}

harness::RankedRun run(const harness::VariantSpec& v, const std::string& scenario,
                       std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  harness::RunOptions options;
  options.timeout = timeout;
  return harness::run_in_threads(
      v, scenarios::find_scenario(scenarios::catalogue(), scenario), options);
}

TEST(PythonStepErrors, AnExceptionIsRecordedWithItsTypeMessageAndTheUsersFileAndLine) {
  const auto r = run(python_step("py/raises", kSteps + "raises.py"), "dist/5-3/float32");
  ASSERT_FALSE(r.fault) << *r.fault;
  ASSERT_EQ(r.ranks.size(), 2u);
  ASSERT_TRUE(r.ranks[1].error);
  EXPECT_EQ(r.ranks[1].error->type, "ValueError");
  EXPECT_EQ(r.ranks[1].error->message,
            "the step rejects rank 1 (at " + kSteps + "raises.py:7)");
  // Its peer stopped at its next collective instead of waiting for it.
  ASSERT_TRUE(r.ranks[0].error);
  EXPECT_EQ(r.ranks[0].error->type, "peer-failure");
}

TEST(PythonStepErrors, ARefusalIsRecordedAsOne) {
  const auto r = run(python_step("py/refuses", kSteps + "refuses.py"), "single/n5/float32");
  ASSERT_TRUE(r.ranks[0].error);
  EXPECT_EQ(r.ranks[0].error->type, "refusal");
  EXPECT_EQ(r.ranks[0].error->message, "this step refuses every scenario");
}

TEST(PythonStepErrors, AWrongReturnValueIsATypeErrorOfTheStep) {
  const auto r = run(python_step("py/bad-return", kSteps + "bad_return.py"), "single/n5/float32");
  ASSERT_TRUE(r.ranks[0].error);
  EXPECT_EQ(r.ranks[0].error->type, "TypeError");
  EXPECT_NE(r.ranks[0].error->message.find("must return a dict"), std::string::npos)
      << r.ranks[0].error->message;
}

TEST(PythonStepErrors, LibTorchErrorsInsideTorchAreTheC10ErrorsACppStepSees) {
  // All masked, linear cross-entropy: backward on a loss with no graph, raised in autograd.
  const auto r = run(py_baseline(), "single/all-masked-linear_ce/float32");
  ASSERT_TRUE(r.ranks[0].error);
  EXPECT_EQ(r.ranks[0].error->type, "c10::Error");
  EXPECT_EQ(r.ranks[0].error->message,
            "element 0 of tensors does not require grad and does not have a grad_fn");
}

TEST(PythonStepErrors, AStepThatNeverStepsIsJudgedNotCrashed) {
  const harness::VariantSpec& v = python_step("py/never-steps", kSteps + "never_steps.py");
  const auto r = run(v, "single/n5/float32");
  ASSERT_FALSE(r.fault);
  ASSERT_FALSE(r.ranks[0].error);
  ASSERT_EQ(r.ranks[0].steps.size(), 1u);
  for (const auto& g : r.ranks[0].steps[0].gradients) EXPECT_FALSE(g.value.defined()) << g.name;
  const oracles::Evaluation e = oracles::evaluate(
      {scenarios::find_scenario(scenarios::catalogue(), "single/n5/float32")}, {v}, {});
  ASSERT_EQ(e.rows.size(), 1u);
  EXPECT_FALSE(e.rows[0].met);
  EXPECT_EQ(e.rows[0].verdict.kind, oracles::VerdictKind::fail);
}

// The oracle catches a broken Python step exactly as it catches a broken C++ one.
TEST(PythonStepErrors, ABrokenNormalisationIsCaughtOnRaggedRanks) {
  const harness::VariantSpec& v = python_step("py/local-mean", kSteps + "local_mean.py");
  const oracles::Evaluation e = oracles::evaluate(
      {scenarios::find_scenario(scenarios::catalogue(), "dist/5-3/float32"),
       scenarios::find_scenario(scenarios::catalogue(), "dist/4-4/float32")},
      {v}, {});
  ASSERT_EQ(e.rows.size(), 2u);
  EXPECT_EQ(e.rows[0].verdict.kind, oracles::VerdictKind::fail);  // ragged: visible
  EXPECT_EQ(e.rows[1].verdict.kind, oracles::VerdictKind::pass);  // equal counts: invisible
}

TEST(PythonStepErrors, TorchDistributedIsInitialisedWithTheHarnessRanks) {
  const harness::VariantSpec& v = python_step("py/distributed-api", kSteps + "distributed_api.py");
  for (const char* scenario : {"single/n5/float32", "dist/5-3/float32", "dist/8-ranks-ragged/float32"}) {
    const auto r = run(v, scenario);
    ASSERT_FALSE(r.fault) << scenario << ": " << *r.fault;
    for (const Observation& o : r.ranks) {
      EXPECT_FALSE(o.error) << scenario << " rank " << o.rank << ": " << o.error->type << " "
                            << o.error->message;
    }
  }
}

TEST(PythonStepErrors, AHangingStepIsEndedByTheTimeoutWithItsRankNamed) {
  const harness::VariantSpec& v = python_step("py/hangs", kSteps + "hangs.py");
  python::set_step_timeout(std::chrono::milliseconds(1500));
  const auto single = run(v, "single/n5/float32", std::chrono::seconds(3));
  const auto two = run(v, "dist/5-3/float32", std::chrono::seconds(3));
  python::set_step_timeout(std::chrono::seconds(60));
  ASSERT_TRUE(single.fault);
  EXPECT_NE(single.fault->find("rank 0"), std::string::npos) << *single.fault;
  EXPECT_NE(single.fault->find("hang"), std::string::npos) << *single.fault;
  ASSERT_TRUE(two.fault);
  EXPECT_NE(two.fault->find("rank 0"), std::string::npos) << *two.fault;
}

TEST(PythonStepErrors, AModelKeptPastItsRunRaisesInsteadOfCrashing) {
  const harness::VariantSpec& v = python_step("py/keeps-model", kSteps + "keeps_model.py");
  const auto first = run(v, "single/n5/float32");
  ASSERT_FALSE(first.ranks[0].error);
  const auto second = run(v, "single/n5/float32");
  ASSERT_TRUE(second.ranks[0].error);
  EXPECT_EQ(second.ranks[0].error->type, "RuntimeError");
  EXPECT_NE(second.ranks[0].error->message.find("after the step returned"), std::string::npos)
      << second.ranks[0].error->message;
}

scenarios::InvalidInput refusal_of(const std::string& file, const std::string& function = "step");
bool has(const std::exception& e, const std::string& needle);

// What a hostile or careless step does is recorded as its own error, never a crash.
std::string error_of(const harness::RankedRun& r, std::size_t rank = 0) {
  if (r.fault) return "fault: " + *r.fault;
  if (!r.ranks.at(rank).error) return "no error";
  return r.ranks[rank].error->type + ": " + r.ranks[rank].error->message;
}

TEST(PythonStepHostility, CtxFromAnotherThreadRaisesInThatThread) {
  const auto r = run(python_step("py/other-thread", kSteps + "other_thread.py"), "dist/5-3/float32");
  EXPECT_EQ(error_of(r), "no error");
  EXPECT_EQ(error_of(r, 1), "no error");
}

TEST(PythonStepHostility, OsExitIsRefusedNotObeyed) {
  const auto r = run(python_step("py/exits", kSteps + "exits.py"), "single/n5/float32");
  EXPECT_NE(error_of(r).find("GradnormUnsupported: os._exit(0) inside a gradnorm step"),
            std::string::npos) << error_of(r);
}

TEST(PythonStepHostility, DdpAndUnofferedCollectivesAreNamedAsUnsupported) {
  const auto ddp = run(python_step("py/ddp", kSteps + "wraps_ddp.py"), "dist/5-3/float32");
  EXPECT_NE(error_of(ddp).find("GradnormUnsupported: DistributedDataParallel needs a real process group"),
            std::string::npos) << error_of(ddp);
  // On an all-masked scenario the reference raises a c10::Error: an unsupported collective
  // must not pass for it.
  const harness::VariantSpec& gather = python_step("py/all-gather", kSteps + "all_gather.py");
  const auto r = run(gather, "single/all-masked-linear_ce/float32");
  EXPECT_NE(error_of(r).find("GradnormUnsupported: torch.distributed allgather is not offered"),
            std::string::npos) << error_of(r);
  const oracles::Evaluation e = oracles::evaluate(
      {scenarios::find_scenario(scenarios::catalogue(), "single/all-masked-linear_ce/float32")},
      {gather}, {});
  EXPECT_EQ(e.rows.at(0).verdict.kind, oracles::VerdictKind::error_mismatch);
}

TEST(PythonStepHostility, TorchGlobalStateAStepChangesDoesNotLeak) {
  const scenarios::Scenario s = scenarios::find_scenario(scenarios::catalogue(), "dist/5-3/float32");
  const auto before = harness::run_in_threads(harness::find_variant("baseline"), s);
  const auto changed = run(python_step("py/default-dtype", kSteps + "default_dtype.py"), "dist/5-3/float32");
  EXPECT_EQ(error_of(changed), "no error");
  const auto after = harness::run_in_threads(harness::find_variant("baseline"), s);
  EXPECT_EQ(digests(before), digests(after));
}

TEST(PythonStepHostility, UnprintableAndInvalidTextMessagesAreRecorded) {
  const harness::VariantSpec& v = python_step("py/odd-messages", kSteps + "odd_messages.py");
  const auto surrogate = run(v, "single/n5/float32");
  EXPECT_NE(error_of(surrogate).find("ValueError: bad \\ud800 text (at "), std::string::npos)
      << error_of(surrogate);
  const auto unprintable = run(v, "dist/5-3/float32");
  EXPECT_NE(error_of(unprintable).find("Unprintable: "), std::string::npos) << error_of(unprintable);
}

TEST(PythonStepHostility, RanksReducingDifferentShapesAreNamed) {
  const auto r = run(python_step("py/mismatched", kSteps + "mismatched.py"), "dist/5-3/float32");
  ASSERT_TRUE(r.fault);
  EXPECT_NE(r.fault->find("ranks reduce different tensors"), std::string::npos) << *r.fault;
  EXPECT_NE(r.fault->find("Float[3]"), std::string::npos) << *r.fault;
  EXPECT_NE(r.fault->find("Float[4]"), std::string::npos) << *r.fault;
}

TEST(PythonStepHostility, ABadReturnCitesTheStepsDefinition) {
  const auto r = run(python_step("py/bad-return", kSteps + "bad_return.py"), "single/n5/float32");
  EXPECT_NE(error_of(r).find("(at the step defined at " + kSteps + "bad_return.py:1)"),
            std::string::npos) << error_of(r);
}

TEST(PythonStepLoading, TwoStepsWhoseFoldersProvideTheSameModuleAreRefused) {
  (void)python_step("py/clash-a", kSteps + "clash_a/mystep.py");
  const auto e = refusal_of(kSteps + "clash_b/mystep.py");
  EXPECT_TRUE(has(e, "both provide module 'helper'")) << e.what();
}

scenarios::InvalidInput refusal_of(const std::string& file, const std::string& function) {
  try {
    (void)python::make_python_variant(
        PythonVariant{"x", {file, function}, Role::candidate, "baseline", ""});
  } catch (const scenarios::InvalidInput& error) {
    return error;
  }
  ADD_FAILURE() << file << " loaded";
  return scenarios::InvalidInput("");
}

bool has(const std::exception& e, const std::string& needle) {
  return std::string(e.what()).find(needle) != std::string::npos;
}

TEST(PythonStepLoading, ASyntaxErrorNamesTheFileAndLine) {
  const auto e = refusal_of(kSteps + "syntax_error.py");
  EXPECT_TRUE(has(e, "SyntaxError")) << e.what();
  EXPECT_TRUE(has(e, kSteps + "syntax_error.py:2")) << e.what();
}

TEST(PythonStepLoading, AnImportErrorNamesTheFileAndLine) {
  const auto e = refusal_of(kSteps + "import_error.py");
  EXPECT_TRUE(has(e, "ModuleNotFoundError")) << e.what();
  EXPECT_TRUE(has(e, kSteps + "import_error.py:1")) << e.what();
}

TEST(PythonStepLoading, AMissingFileOrFunctionIsNamed) {
  EXPECT_TRUE(has(refusal_of(kSteps + "no_such_file.py"), "does not exist"));
  const auto e = refusal_of(kSteps + "never_steps.py", "train");
  EXPECT_TRUE(has(e, "defines no function 'train'")) << e.what();
}

TEST(PythonStepLoading, CannotRunMustAnswerAStringOrNone) {
  const harness::VariantSpec& v = python_step("py/bad-cannot-run", kSteps + "bad_cannot_run.py");
  const scenarios::Scenario s = scenarios::find_scenario(scenarios::catalogue(), "single/n5/float32");
  EXPECT_THROW((void)harness::not_applicable(v, s), scenarios::InvalidInput);
}

TEST(PythonStepLoading, StepSourcesSplitAtTheLastColon) {
  EXPECT_EQ(python::parse_step_source("a/b.py").function, "step");
  EXPECT_EQ(python::parse_step_source("a/b.py:train").function, "train");
  EXPECT_EQ(python::parse_step_source("a/b.py:train").file, "a/b.py");
  EXPECT_THROW((void)python::parse_step_source("a/b.py:"), scenarios::InvalidInput);
  EXPECT_THROW((void)python::parse_python_role("negative_control"), scenarios::InvalidInput);
}

}  // namespace
}  // namespace gradnorm
