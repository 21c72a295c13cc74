// Models from TorchScript files: trained in the scenario's dtype by every step, judged
// against the oracle's float64 copy; a file gradnorm cannot train is an input error naming
// it. The modules are scripted with LibTorch's jit API here, and in Python with
// the environment's torch, as a user would script theirs.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "gradnorm/harness/determinism.hpp"
#include "gradnorm/harness/transport.hpp"
#include "gradnorm/oracles/evaluation.hpp"
#include "gradnorm/scenarios/catalogue.hpp"
#include "support/files.hpp"
#include "support/model_files.hpp"
#include "support/scripted_model.hpp"

namespace gradnorm {
namespace {

using scenarios::InvalidInput;
using testing_support::TemporaryDirectory;

scenarios::Scenario scripted(const std::string& file, const std::string& base) {
  scenarios::Scenario s = scenarios::find_scenario(base);
  s.name = "scripted/" + base;
  s.model = scenarios::ModelKind::torchscript;
  s.model_file = file;
  return s;
}

using testing_support::row_of;
std::string input_error(const scenarios::Scenario& s) { return testing_support::model_input_error(s); }

TEST(TorchScriptModel, TrainedAndJudgedOnOneDeviceAndOnRaggedRanks) {
  TemporaryDirectory dir;
  const std::string file = (dir.path() / "causal.pt").string();
  testing_support::save_scripted_causal_lm(file);
  harness::DeterminismGuard guard;
  for (const char* base : {"single/n5/float32", "single/accum2-ragged/float64", "dist/5-3/float32"}) {
    const scenarios::Scenario s = scripted(file, base);
    const oracles::Evaluation e = oracles::evaluate(
        {s}, {harness::find_variant("baseline"), harness::find_variant("skip"),
              harness::find_variant("broken/scale-pass-dropped")});
    ASSERT_FALSE(e.fault) << *e.fault;
    const auto& baseline = row_of(e, "baseline");
    EXPECT_EQ(baseline.verdict.kind, oracles::VerdictKind::pass)
        << base << ": " << (baseline.verdict.reasons.empty() ? "" : baseline.verdict.reasons[0]);
    EXPECT_LT(baseline.verdict.gradients.rel_l2_error, 1e-5) << base;
    // Negative control: the oracle judges the scripted model's numbers, it does not wave them
    // through: token sums are caught.
    EXPECT_EQ(row_of(e, "broken/scale-pass-dropped").verdict.kind, oracles::VerdictKind::fail) << base;
    // skip is right on one device (with accumulation its gate stays closed), wrong on the
    // ragged ranks [5, 3].
    const bool skip_right = s.world_size == 1;
    EXPECT_EQ(row_of(e, "skip").verdict.kind == oracles::VerdictKind::pass, skip_right) << base;
  }
}

TEST(TorchScriptModel, ParametersComeFromTheFileRoundedToTheScenarioDtype) {
  TemporaryDirectory dir;
  const std::string file = (dir.path() / "causal.pt").string();
  testing_support::save_scripted_causal_lm(file);
  const scenarios::Scenario s = scripted(file, "single/n5/bfloat16");
  const auto model = harness::make_model(s, {scenarios::ModelKind::torchscript, false, false});
  ASSERT_EQ(model->parameters().size(), 5u);
  EXPECT_EQ(model->parameters().front().name, "embedding");
  for (const harness::Parameter& p : model->parameters()) {
    EXPECT_EQ(p.value.scalar_type(), at::kBFloat16) << p.name;
    EXPECT_TRUE(p.trainable) << p.name;
  }
  const auto twin = model->converted(at::kDouble);
  EXPECT_TRUE(at::equal(twin->parameters()[0].value, model->parameters()[0].value.to(at::kDouble)));
}

TEST(TorchScriptModel, RunsAreBitIdentical) {
  TemporaryDirectory dir;
  const std::string file = (dir.path() / "causal.pt").string();
  testing_support::save_scripted_causal_lm(file);
  harness::DeterminismGuard guard;
  scenarios::Scenario s = scripted(file, "single/n5/float32");
  s.steps = 3;
  const auto first = harness::run_single_device(harness::find_variant("baseline"), s);
  const auto second = harness::run_single_device(harness::find_variant("baseline"), s);
  ASSERT_EQ(first.steps.size(), 3u);
  EXPECT_EQ(harness::digest(first), harness::digest(second));
}

TEST(TorchScriptModel, LoraAndQatRecipesCannotRunIt) {
  const scenarios::Scenario s = scripted("/nonexistent.pt", "single/n5/float32");
  EXPECT_TRUE(harness::not_applicable(harness::find_variant("lora-baseline"), s));
  EXPECT_TRUE(harness::not_applicable(harness::find_variant("qat-baseline"), s));
  EXPECT_FALSE(harness::not_applicable(harness::find_variant("baseline"), s));
}

TEST(TorchScriptModel, FilesItCannotTrainAreInputErrorsNamingThem) {
  TemporaryDirectory dir;
  auto path = [&](const char* name) { return (dir.path() / name).string(); };
  const std::string base = "single/n5/float32";

  EXPECT_NE(input_error(scripted(path("missing.pt"), base)).find("missing.pt' does not exist"),
            std::string::npos);
  std::ofstream(path("garbage.pt")) << "not a zip archive";
  EXPECT_NE(input_error(scripted(path("garbage.pt"), base)).find("is not a TorchScript module"),
            std::string::npos);
  EXPECT_NE(input_error(scripted(dir.path().string(), base)).find("is not a regular file"),
            std::string::npos);

  testing_support::save_scripted_causal_lm(path("vocab7.pt"), {.vocab = 7});
  const std::string shape = input_error(scripted(path("vocab7.pt"), base));
  EXPECT_NE(shape.find("expected floating logits [2, 8, 11]"), std::string::npos) << shape;
  EXPECT_NE(shape.find("[2, 8, 7]"), std::string::npos) << shape;

  testing_support::save_scripted_causal_lm(path("int.pt"), {.integer_parameter = true});
  EXPECT_NE(input_error(scripted(path("int.pt"), base)).find("parameter 'step_count' of type Long"),
            std::string::npos);

  testing_support::save_scripted_causal_lm(path("frozen.pt"), {.trainable = false});
  EXPECT_NE(input_error(scripted(path("frozen.pt"), base)).find("no parameter that requires grad"),
            std::string::npos);

  testing_support::save_scripted_causal_lm(path("noforward.pt"), {.forward_name = "predict"});
  EXPECT_NE(input_error(scripted(path("noforward.pt"), base)).find("has no forward method"),
            std::string::npos);

  // Negative control: the same checks accept a good file.
  testing_support::save_scripted_causal_lm(path("good.pt"));
  EXPECT_EQ(input_error(scripted(path("good.pt"), base)), "<accepted>");
}

// The user's way: an nn.Module scripted in Python and saved with torch.jit.save.
TEST(TorchScriptModel, AModuleScriptedInPythonIsTrainedAndJudged) {
  TemporaryDirectory dir;
  const std::string file = (dir.path() / "python.pt").string();
  const std::string script = R"(
import sys, torch
class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.embed = torch.nn.Embedding(11, 6)
        self.mix = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 11)
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        steps = torch.arange(1, tokens.size(1) + 1, dtype=x.dtype).view(1, -1, 1)
        return self.head(torch.tanh(self.mix(x.cumsum(1) / steps)))
torch.jit.script(TinyLM()).save(sys.argv[1])
)";
  std::ofstream(dir.path() / "make.py") << script;
  ASSERT_EQ(std::system((std::string(GRADNORM_TEST_PYTHON) + " " + (dir.path() / "make.py").string() + " " + file).c_str()), 0);
  harness::DeterminismGuard guard;
  const scenarios::Scenario s = scripted(file, "dist/5-3/float64");
  const oracles::Evaluation e = oracles::evaluate({s}, {harness::find_variant("baseline")});
  ASSERT_FALSE(e.fault) << *e.fault;
  EXPECT_EQ(e.rows.at(0).verdict.kind, oracles::VerdictKind::pass);
  EXPECT_EQ(e.rows.at(0).observation.initial_parameters.front().name, "embed.weight");
}

}  // namespace
}  // namespace gradnorm
