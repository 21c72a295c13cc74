// The named scenarios: stable, unique, valid identities, found by name or pattern.

#include "gradnorm/scenarios/catalogue.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace {

using gradnorm::scenarios::catalogue;
using gradnorm::scenarios::DType;
using gradnorm::scenarios::find_scenario;
using gradnorm::scenarios::InvalidInput;
using gradnorm::scenarios::Scenario;
using gradnorm::scenarios::select_scenarios;

constexpr const char* kDTypeSuffixes[] = {"float64", "float32", "bfloat16"};

std::vector<std::string> names_of(const std::vector<Scenario>& scenarios) {
  std::vector<std::string> names;
  for (const Scenario& s : scenarios) names.push_back(s.name);
  return names;
}

// Names the first repeated entry.
testing::AssertionResult all_unique(const std::vector<std::string>& names) {
  std::set<std::string> seen;
  for (const std::string& name : names) {
    if (!seen.insert(name).second) return testing::AssertionFailure() << "'" << name << "' twice";
  }
  return testing::AssertionSuccess();
}

bool in_catalogue(const std::string& name) {
  const auto names = names_of(catalogue());
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// find_scenario(name) throws InvalidInput holding every fragment.
testing::AssertionResult find_rejects(std::string_view name,
                                      std::initializer_list<std::string> fragments) {
  try {
    (void)find_scenario(name);
    return testing::AssertionFailure() << "'" << name << "' was found";
  } catch (const InvalidInput& error) {
    const std::string message = error.what();
    for (const std::string& fragment : fragments) {
      if (message.find(fragment) == std::string::npos) {
        return testing::AssertionFailure() << "message lacks '" << fragment << "': " << message;
      }
    }
    return testing::AssertionSuccess();
  }
}

TEST(Catalogue, IsNotEmpty) { EXPECT_FALSE(catalogue().empty()); }

TEST(Catalogue, NamesAreUnique) {
  EXPECT_TRUE(all_unique(names_of(catalogue())));
  // Negative control: the check sees a repeat.
  EXPECT_FALSE(all_unique({"single/n1/float64", "single/n3/float64", "single/n1/float64"}));
}

// Unique but for first-valid/X, which is X with its first labels valid and so keeps X's seed
// (its tokens and parameters are X's); that twin must exist and differ in first_label only.
TEST(Catalogue, SeedsAreUnique) {
  std::set<std::uint64_t> seeds;
  const std::string prefix = "first-valid/";
  int twins = 0;
  for (const Scenario& s : catalogue()) {
    if (s.name.rfind(prefix, 0) == 0) {
      const Scenario& masked = find_scenario(s.name.substr(prefix.size()));
      EXPECT_EQ(s.seed, masked.seed) << s.name;
      EXPECT_EQ(s.first_label, gradnorm::scenarios::FirstLabel::valid) << s.name;
      EXPECT_EQ(masked.first_label, gradnorm::scenarios::FirstLabel::masked) << masked.name;
      EXPECT_EQ(s.valid_tokens, masked.valid_tokens) << s.name;
      EXPECT_EQ(s.dtype, masked.dtype) << s.name;
      ++twins;
      continue;
    }
    EXPECT_TRUE(seeds.insert(s.seed).second) << s.name << " reuses seed " << s.seed;
  }
  EXPECT_EQ(twins, 18);
}

TEST(Catalogue, EveryEntryValidates) {
  for (const Scenario& s : catalogue()) {
    EXPECT_NO_THROW(gradnorm::scenarios::validate(s)) << gradnorm::scenarios::describe(s);
  }
}

TEST(Catalogue, NameEndsWithItsDType) {
  for (const Scenario& s : catalogue()) {
    const std::string suffix = "/" + std::string(gradnorm::scenarios::to_string(s.dtype));
    EXPECT_TRUE(ends_with(s.name, suffix)) << s.name << " trains in " << suffix;
  }
}

TEST(Catalogue, RequiredNamesExistInEveryDType) {
  for (const char* base :
       {"single/n1", "single/n3", "single/n5", "single/n8", "single/all-masked-mean_ce",
        "single/accum2-ragged", "single/accum4-ragged", "single/clip-active",
        "single/clip-inactive"}) {
    for (const char* dtype : kDTypeSuffixes) {
      const std::string name = std::string(base) + "/" + dtype;
      EXPECT_TRUE(in_catalogue(name)) << name << " missing";
    }
  }
  // Negative control: the lookup can say no.
  EXPECT_FALSE(in_catalogue("single/n2/float64"));
}

TEST(Catalogue, SingleCountsMatchTheirNames) {
  for (int n : {1, 3, 5, 8}) {
    for (const char* dtype : kDTypeSuffixes) {
      const std::string name = "single/n" + std::to_string(n) + "/" + dtype;
      const Scenario& s = find_scenario(name);
      EXPECT_EQ(s.world_size, 1) << name;
      EXPECT_EQ(s.global_token_count(), n) << name;
      EXPECT_EQ(gradnorm::scenarios::to_string(s.dtype), dtype) << name;
    }
  }
}

TEST(Catalogue, AllMaskedEntriesHoldNoValidToken) {
  int all_masked = 0;
  for (const Scenario& s : catalogue()) {
    if (s.name.rfind("single/all-masked-", 0) != 0) continue;
    ++all_masked;
    EXPECT_EQ(s.global_token_count(), 0) << s.name;
  }
  EXPECT_GE(all_masked, 3);
  // Negative control: an ordinary entry holds tokens.
  EXPECT_GT(find_scenario("single/n1/float64").global_token_count(), 0);
}

TEST(Catalogue, ClipEntriesSetTheirMaxNorm) {
  for (const char* dtype : kDTypeSuffixes) {
    const Scenario& active = find_scenario(std::string("single/clip-active/") + dtype);
    const Scenario& inactive = find_scenario(std::string("single/clip-inactive/") + dtype);
    ASSERT_TRUE(active.clip_max_norm.has_value());
    ASSERT_TRUE(inactive.clip_max_norm.has_value());
    EXPECT_LT(*active.clip_max_norm, *inactive.clip_max_norm);
  }
  EXPECT_FALSE(find_scenario("single/n5/float64").clip_max_norm.has_value());
}

TEST(Catalogue, RaggedEntriesAccumulate) {
  const Scenario& two = find_scenario("single/accum2-ragged/float32");
  EXPECT_EQ(two.accumulation_steps, 2);
  const Scenario& four = find_scenario("single/accum4-ragged/float32");
  EXPECT_EQ(four.accumulation_steps, 4);
  // Ragged: the micro-batches do not all hold the same count.
  const auto& row = four.valid_tokens.at(0);
  EXPECT_NE(*std::min_element(row.begin(), row.end()), *std::max_element(row.begin(), row.end()));
}

TEST(FindScenario, ReturnsTheNamedEntry) {
  const Scenario& s = find_scenario("single/n3/bfloat16");
  EXPECT_EQ(s.name, "single/n3/bfloat16");
  EXPECT_EQ(s.dtype, DType::bfloat16);
  // The same object every time: catalogue() is built once.
  EXPECT_EQ(&find_scenario("single/n3/bfloat16"), &s);
}

TEST(FindScenario, UnknownNameSuggestsNeighbours) {
  EXPECT_TRUE(find_rejects("single/nope", {"single/nope", "did you mean", "single/"}));
  // No shared prefix: nothing to suggest, but the name is repeated.
  EXPECT_TRUE(find_rejects("zzz", {"'zzz'"}));
  // Negative control: a known name is not rejected.
  EXPECT_FALSE(find_rejects("single/n1/float64", {}));
}

TEST(SelectScenarios, QuestionMarkPicksTheFourSingleCounts) {
  const auto names = names_of(select_scenarios("single/n?/float64"));
  EXPECT_EQ(names, (std::vector<std::string>{"single/n1/float64", "single/n3/float64",
                                             "single/n5/float64", "single/n8/float64"}));
}

TEST(SelectScenarios, StarPatternSelectsExactlyTheMatchingNames) {
  // Every catalogue name of the form single/n<anything>/float64: the four single-count
  // entries and the single/n5-..., single/n6-... variations.
  std::vector<std::string> want;
  for (const Scenario& s : catalogue()) {
    if (s.name.rfind("single/n", 0) == 0 && ends_with(s.name, "/float64")) want.push_back(s.name);
  }
  const auto names = names_of(select_scenarios("single/n*/float64"));
  EXPECT_EQ(names, want);
  for (const char* n : {"single/n1/float64", "single/n3/float64", "single/n5/float64",
                        "single/n8/float64"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  }
  for (const std::string& name : names) EXPECT_TRUE(ends_with(name, "/float64")) << name;
}

TEST(SelectScenarios, DTypeSuffixSelectsExactlyThatDtype) {
  std::size_t total = 0;
  for (const char* dtype : kDTypeSuffixes) {
    std::size_t want = 0;
    for (const Scenario& s : catalogue()) want += ends_with(s.name, std::string("/") + dtype) ? 1 : 0;
    const auto selected = select_scenarios(std::string("*/") + dtype);
    EXPECT_EQ(selected.size(), want) << dtype;
    for (const Scenario& s : selected) EXPECT_EQ(to_string(s.dtype), dtype) << s.name;
    total += want;
  }
  // Every entry is named after its dtype.
  EXPECT_EQ(total, catalogue().size());
}

TEST(SelectScenarios, ExactNameSelectsItself) {
  const auto selected = select_scenarios("single/clip-active/float32");
  ASSERT_EQ(selected.size(), 1U);
  EXPECT_EQ(selected[0].name, "single/clip-active/float32");
}

TEST(SelectScenarios, NoMatchThrows) {
  EXPECT_THROW((void)select_scenarios("zzz*"), InvalidInput);
  try {
    (void)select_scenarios("zzz*");
  } catch (const InvalidInput& error) {
    EXPECT_NE(std::string(error.what()).find("zzz*"), std::string::npos) << error.what();
  }
  // Negative control: a matching pattern does not throw.
  EXPECT_NO_THROW((void)select_scenarios("single/*"));
}

}  // namespace
