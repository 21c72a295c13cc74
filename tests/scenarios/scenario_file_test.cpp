#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include <string>
#include <vector>

#include "gradnorm/scenarios/catalogue.hpp"
#include "gradnorm/scenarios/generators.hpp"
#include "gradnorm/scenarios/scenario_file.hpp"
#include "support/files.hpp"

namespace gradnorm::scenarios {
namespace {

::testing::AssertionResult rejects(const std::string& text, const std::string& needle) {
  try {
    (void)parse_scenarios(text, "test.toml");
  } catch (const InvalidInput& error) {
    if (std::string(error.what()).find(needle) != std::string::npos) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << "message lacks '" << needle << "': " << error.what();
  }
  return ::testing::AssertionFailure() << "accepted:\n" << text;
}

TEST(ScenarioFile, ReadsFieldsAndInfersTheWindowFromTheCounts) {
  const auto list = parse_scenarios(R"(
[[scenario]]
name = "mine/5-3"
valid_tokens = [[5, 1], [3, 2]]
dtype = "bfloat16"
loss = "chunked_ce"
rank_average = "divide_before_sum"
clip_max_norm = 1
learning_rate = 0.25
seed = 42
[[scenario.expect]]
variant = "skip"
verdict = "fail"
reason = "ragged"
checks = ["gradients"]
)",
                                    "test.toml");
  ASSERT_EQ(list.size(), 1u);
  const Scenario& s = list[0];
  EXPECT_EQ(s.name, "mine/5-3");
  EXPECT_EQ(s.world_size, 2);
  EXPECT_EQ(s.accumulation_steps, 2);
  EXPECT_EQ(s.global_token_count(), 11);
  EXPECT_EQ(s.dtype, DType::bfloat16);
  EXPECT_EQ(s.loss, LossKind::chunked_ce);
  EXPECT_EQ(s.rank_average, RankAverage::divide_before_sum);
  ASSERT_TRUE(s.clip_max_norm);
  EXPECT_EQ(*s.clip_max_norm, 1.0);
  EXPECT_EQ(s.learning_rate, 0.25);
  EXPECT_EQ(s.seed, 42u);
  ASSERT_EQ(s.expected_verdicts.size(), 1u);
  EXPECT_EQ(s.expected_verdicts[0].verdict, "fail");
  // Untouched fields keep the defaults.
  EXPECT_EQ(s.vocab_size, Scenario{}.vocab_size);
}

TEST(ScenarioFile, RejectsATypoByName) {
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"x\"\nworld_sise = 2\n", "world_sise is not a scenario field"));
}

TEST(ScenarioFile, RejectsAWrongType) {
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"x\"\ndtype = 3\n", "dtype must be a string"));
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"x\"\nsteps = 1.5\n", "steps must be an integer"));
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"x\"\nvalid_tokens = [5]\n", "valid_tokens must be an array of arrays"));
}

TEST(ScenarioFile, RejectsAnUnknownEnumValueListingTheChoices) {
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"x\"\ndtype = \"float16\"\n", "expected one of float64, float32, bfloat16"));
}

TEST(ScenarioFile, RejectsImpossibleCountsThroughValidate) {
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"x\"\nvalid_tokens = [[50]]\n", "asks for 50 valid tokens but holds 14"));
}

// Integers are range-checked before they are narrowed: 2^32 + 5 must not run as 5, and a
// pair that wraps to [[5], [3]] must not run as that. The control: an in-range count reads.
TEST(ScenarioFile, RejectsCountsThatWouldWrapWhenNarrowed) {
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"x\"\nvalid_tokens = [[4294967301]]\n",
                      "valid_tokens holds 4294967301, out of range"));
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"x\"\nworld_size = 2\nvalid_tokens = [[-4294967291], [4294967299]]\n",
                      "valid_tokens holds -4294967291, out of range"));
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"x\"\nsteps = 4294967297\n", "steps is out of range"));
  EXPECT_EQ(parse_scenarios("[[scenario]]\nname = \"x\"\nvalid_tokens = [[5]]\n", "t.toml").at(0).valid_tokens,
            (std::vector<std::vector<int>>{{5}}));
}

// Found by the parser's fuzzer (fuzz/regressions): products of in-range mesh sizes that
// overflowed an int (undefined behaviour; UBSan stopped on them), and a NUL byte.
TEST(ScenarioFile, RejectsMeshProductsPastAnIntAndNulBytes) {
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"x\"\nworld_size = 4096\ndp_replicate = 4096\ntp = 4096\ncp = 128\n",
                      "is not dp_replicate 4096 x dp_shard x cp 128 x tp 4096"));
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"x\"\nvalid_tokens = [[1]]\ntp = 65536\ncp = 65536\n",
                      "imply 1 rows x tp 65536 x cp 65536 = 4294967296 ranks, more than 4096"));
  EXPECT_TRUE(rejects(std::string("[[scenario]]\n[\0", 16), "test.toml:2: not valid TOML: a NUL byte"));
}

// A counter-example's [[scenario]] table replays it: read back, it is the same scenario in
// every field (the table of the copy equals the table of the original, and so do the lines).
RC_GTEST_PROP(ScenarioTable, ReadsBackAsTheSameScenario, ()) {
  const Scenario s = *rc::gen::oneOf(single_device_scenarios(), multi_rank_scenarios(), ragged_rank_scenarios());
  const std::string table = scenario_table(s);
  const std::vector<Scenario> back = parse_scenarios(table, "replay.toml");
  RC_ASSERT(back.size() == 1u);
  RC_ASSERT(scenario_table(back[0]) == table);
  RC_ASSERT(describe(back[0]) == describe(s));
}

// Every catalogue scenario too, with its findings and their checks; and the control: a
// changed field shows in the table.
TEST(ScenarioTable, ReplaysTheCatalogueWithItsFindings) {
  for (const Scenario& s : catalogue()) {
    const std::vector<Scenario> back = parse_scenarios(scenario_table(s), "replay.toml");
    ASSERT_EQ(back.size(), 1u) << s.name;
    EXPECT_EQ(scenario_table(back[0]), scenario_table(s)) << s.name;
    ASSERT_EQ(back[0].expected_verdicts.size(), s.expected_verdicts.size()) << s.name;
    for (std::size_t i = 0; i < s.expected_verdicts.size(); ++i) {
      EXPECT_EQ(back[0].expected_verdicts[i].checks, s.expected_verdicts[i].checks) << s.name;
    }
  }
  Scenario changed = catalogue().front();
  const std::string before = scenario_table(changed);
  changed.weight_decay = 0.25;
  EXPECT_NE(scenario_table(changed), before);
  EXPECT_NE(scenario_table(changed).find("weight_decay = 0.25\n"), std::string::npos);
}

// An empty string is not a default: dtype = "" and model = "" are refused by name.
TEST(ScenarioFile, RejectsEmptyEnumStrings) {
  for (const char* key : {"dtype", "mask", "loss", "optimizer", "rank_average", "model"}) {
    EXPECT_TRUE(rejects(std::string("[[scenario]]\nname = \"x\"\n") + key + " = \"\"\n",
                        std::string(key) + " must not be empty"));
  }
}

// Names are printed in tables: a newline or a NUL in one would cut them. The control: a
// name with spaces and brackets is fine.
TEST(ScenarioFile, RejectsControlCharactersInNames) {
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"a\\nb\"\n", "holds the control character 0x0a"));
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"a\\u0000b\"\n", "holds the control character 0x00"));
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"tab\\there\"\n", "holds the control character 0x09"));
  EXPECT_EQ(parse_scenarios("[[scenario]]\nname = \"a [1, 7] b\"\n", "t.toml").at(0).name, "a [1, 7] b");
}

// Floating fields refuse NaN and the infinities (TOML spells them nan and inf).
TEST(ScenarioFile, RejectsNonFiniteNumbers) {
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"x\"\nlearning_rate = nan\n", "learning_rate"));
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"x\"\nweight_decay = inf\n", "weight_decay"));
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"x\"\nclip_max_norm = -inf\n", "clip_max_norm"));
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"x\"\nmomentum = nan\n", "momentum"));
}

TEST(ScenarioFile, ReportsTheLineOfMalformedToml) {
  EXPECT_TRUE(rejects("[[scenario]\nname = \"x\"\n", "test.toml:1:"));
}

TEST(ScenarioFile, RejectsMissingNamesDuplicatesAndStrayTables) {
  EXPECT_TRUE(rejects("[[scenario]]\nseed = 1\n", "name is missing"));
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"x\"\n[[scenario]]\nname = \"x\"\n", "appears twice"));
  EXPECT_TRUE(rejects("[scenarios]\nname = \"x\"\n", "unexpected top-level key 'scenarios'"));
  EXPECT_TRUE(rejects("", "no [[scenario]] or [[variant]] table"));
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"x\"\n[[scenario.expect]]\nvariant = \"skip\"\nverdict = \"oops\"\nreason = \"r\"\n",
                      "names verdict 'oops'"));
}

TEST(ScenarioFile, VariantTablesNamePythonStepsBesideTheFile) {
  const ScenarioFile file = parse_scenario_file(
      "[[variant]]\nname = \"mine\"\npython = \"steps/mine.py:train\"\nrole = \"reference\"\n"
      "[[variant]]\nname = \"abs\"\npython = \"/opt/s.py\"\nfindings_of = \"skip\"\n",
      "/work/project/scenarios.toml");
  EXPECT_TRUE(file.scenarios.empty());
  ASSERT_EQ(file.variants.size(), 2u);
  EXPECT_EQ(file.variants[0].name, "mine");
  EXPECT_EQ(file.variants[0].python, "/work/project/steps/mine.py:train");
  EXPECT_EQ(file.variants[0].role, "reference");
  EXPECT_EQ(file.variants[0].reference, "baseline");  // the default
  EXPECT_EQ(file.variants[1].python, "/opt/s.py");
  EXPECT_EQ(file.variants[1].role, "candidate");
  EXPECT_EQ(file.variants[1].findings_of, "skip");
  // A file of steps alone has no scenarios to give the scenario-only reader.
  EXPECT_THROW((void)parse_scenarios("[[variant]]\nname = \"m\"\npython = \"m.py\"\n", "f.toml"),
               InvalidInput);
}

TEST(ScenarioFile, RejectsBadVariantTables) {
  EXPECT_TRUE(rejects("[[variant]]\npython = \"m.py\"\n", "name is missing"));
  EXPECT_TRUE(rejects("[[variant]]\nname = \"m\"\n", "python is missing"));
  EXPECT_TRUE(rejects("[[variant]]\nname = \"m\"\npython = \"m.py\"\nlanguage = \"py\"\n",
                      "language is not a variant field"));
  EXPECT_TRUE(rejects("[[variant]]\nname = \"m\"\npython = \"m.py\"\n"
                      "[[variant]]\nname = \"m\"\npython = \"n.py\"\n",
                      "variant name 'm' appears twice"));
  EXPECT_TRUE(rejects("variant = 3\n", "variant must be [[variant]] tables"));
}

TEST(ScenarioFile, ATorchScriptModelIsFoundBesideTheFile) {
  const auto list = parse_scenarios("[[scenario]]\nname = \"s\"\nvalid_tokens = [[5]]\n"
                                    "model = \"torchscript:models/lm.pt\"\n",
                                    "/work/project/scenarios.toml");
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].model, ModelKind::torchscript);
  EXPECT_EQ(list[0].model_file, "/work/project/models/lm.pt");
  EXPECT_NE(describe(list[0]).find("model=torchscript:/work/project/models/lm.pt"), std::string::npos);
  const auto absolute = parse_scenarios("[[scenario]]\nname = \"s\"\nvalid_tokens = [[5]]\n"
                                        "model = \"torchscript:/opt/lm.pt\"\n",
                                        "here/scenarios.toml");
  EXPECT_EQ(absolute[0].model_file, "/opt/lm.pt");
}

TEST(ScenarioFile, RejectsATorchScriptModelWithoutAFile) {
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"s\"\nmodel = \"torchscript\"\n",
                      "model needs a file: \"torchscript:PATH\""));
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"s\"\nmodel = \"torchscript:\"\n",
                      "model names no file"));
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"s\"\nmodel = \"scripted\"\n",
                      "(or \"torchscript:PATH\", \"python:FILE.py:FUNCTION\")"));
}

TEST(ScenarioFile, APythonModelNamesAFileBesideTheScenarioFileAndAFunction) {
  const auto list = parse_scenarios("[[scenario]]\nname = \"s\"\nvalid_tokens = [[5]]\n"
                                    "model = \"python:models/lm.py:tiny_lm\"\n",
                                    "/work/project/scenarios.toml");
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].model, ModelKind::python);
  EXPECT_EQ(list[0].model_file, "/work/project/models/lm.py");
  EXPECT_EQ(list[0].model_function, "tiny_lm");
  EXPECT_NE(describe(list[0]).find("model=python:/work/project/models/lm.py:tiny_lm"), std::string::npos);
  // A colon in a folder's name belongs to the folder.
  const auto colons = parse_scenarios("[[scenario]]\nname = \"s\"\nvalid_tokens = [[5]]\n"
                                      "model = \"python:/opt/a:b/lm.py:build\"\n",
                                      "here/scenarios.toml");
  EXPECT_EQ(colons[0].model_file, "/opt/a:b/lm.py");
  EXPECT_EQ(colons[0].model_function, "build");
  // Written back, read back: the same scenario.
  const auto again = parse_scenarios(scenario_table(list[0]), "/elsewhere/s.toml");
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].model_file, "/work/project/models/lm.py");
  EXPECT_EQ(again[0].model_function, "tiny_lm");
}

TEST(ScenarioFile, RejectsAPythonModelWithoutAFileOrAFunction) {
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"s\"\nmodel = \"python\"\n",
                      "model needs a file and a function: \"python:FILE.py:FUNCTION\""));
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"s\"\nmodel = \"python:\"\n",
                      "model names no file"));
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"s\"\nmodel = \"python:lm.py\"\n",
                      "model names no function in 'lm.py'"));
  EXPECT_TRUE(rejects("[[scenario]]\nname = \"s\"\nmodel = \"python:lm.py:\"\n",
                      "model names no function in 'lm.py'"));
}

TEST(ScenarioFile, MissingFileIsAnInputError) {
  EXPECT_THROW((void)load_scenario_file("/nonexistent/scenarios.toml"), InvalidInput);
}


::testing::AssertionResult load_refuses(const std::string& path, const std::string& needle) {
  try {
    (void)load_scenario_file_contents(path);
  } catch (const InvalidInput& error) {
    if (std::string(error.what()).find(needle) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "message lacks '" << needle << "': " << error.what();
  }
  return ::testing::AssertionFailure() << "read " << path;
}

// Asked before opening: /dev/zero used to be read for 4 GiB and a FIFO blocked forever (this
// test would hang without the check). Control: a regular file of the same folder reads.
TEST(ScenarioFile, RefusesFilesThatAreNotRegularFiles) {
  testing_support::TemporaryDirectory folder("gradnorm-file-kinds");
  EXPECT_TRUE(load_refuses("/dev/zero", "is not a regular file"));
  EXPECT_TRUE(load_refuses(folder.path().string(), "is not a regular file"));
  const std::string fifo = (folder.path() / "scenarios.toml").string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_TRUE(load_refuses(fifo, "is not a regular file"));
  const std::string regular = (folder.path() / "ok.toml").string();
  std::ofstream(regular) << "[[scenario]]\nname = \"x\"\n";
  EXPECT_EQ(load_scenario_file_contents(regular).scenarios.size(), 1u);
}

// A file past the cap is refused by its size, before it is read; one byte under the cap is
// read (and then judged as TOML: here, a comment and one scenario).
TEST(ScenarioFile, RefusesFilesAboveTheSizeCap) {
  testing_support::TemporaryDirectory folder("gradnorm-file-size");
  const std::string scenario = "[[scenario]]\nname = \"x\"\n";
  auto write = [&](const std::string& name, std::size_t size) {
    const std::string path = (folder.path() / name).string();
    std::ofstream out(path);
    out << scenario << '#' << std::string(size - scenario.size() - 2, 'x') << '\n';
    return path;
  };
  EXPECT_TRUE(load_refuses(write("big.toml", kMaxScenarioFileBytes + 1),
                           "more than the 67108864 bytes a scenario file may hold"));
  EXPECT_EQ(load_scenario_file_contents(write("fits.toml", kMaxScenarioFileBytes)).scenarios.size(), 1u);
}

}  // namespace
}  // namespace gradnorm::scenarios
