// The README's "Write your own step" code is the compiled example: every code block marked
// <!-- code: PATH --> must stand verbatim in that file of the repository.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/files.hpp"

namespace gradnorm {
namespace {

struct MarkedBlock {
  std::string path;
  std::string code;
};

std::vector<MarkedBlock> marked_blocks(const std::string& markdown) {
  std::vector<MarkedBlock> out;
  const std::string marker = "<!-- code: ";
  for (std::size_t at = markdown.find(marker); at != std::string::npos;
       at = markdown.find(marker, at + 1)) {
    const std::size_t path_end = markdown.find(" -->", at);
    const std::size_t fence = markdown.find("```", path_end);
    const std::size_t body = markdown.find('\n', fence) + 1;
    const std::size_t close = markdown.find("\n```", body);
    if (path_end == std::string::npos || fence == std::string::npos || close == std::string::npos) break;
    out.push_back({markdown.substr(at + marker.size(), path_end - at - marker.size()),
                   markdown.substr(body, close - body + 1)});
  }
  return out;
}

::testing::AssertionResult stands_in(const MarkedBlock& block) {
  const std::string file = testing_support::read_file(std::string(GRADNORM_SOURCE_DIR) + "/" + block.path);
  if (file.empty()) return ::testing::AssertionFailure() << block.path << " is missing or empty";
  if (file.find(block.code) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "README block marked " << block.path
                                       << " is not in that file:\n" << block.code;
}

TEST(Readme, WriteYourOwnStepCodeIsTheCompiledExample) {
  const std::string readme = testing_support::read_file(std::string(GRADNORM_SOURCE_DIR) + "/README.md");
  const std::vector<MarkedBlock> blocks = marked_blocks(readme);
  ASSERT_GE(blocks.size(), 5u) << "the README lost its marked example blocks";
  for (const MarkedBlock& block : blocks) EXPECT_TRUE(stands_in(block));
}

// Negative control: one changed character and the block no longer stands in its file.
TEST(Readme, AnEditedBlockIsCaught) {
  const std::string readme = testing_support::read_file(std::string(GRADNORM_SOURCE_DIR) + "/README.md");
  std::vector<MarkedBlock> blocks = marked_blocks(readme);
  ASSERT_FALSE(blocks.empty());
  MarkedBlock edited = blocks.front();
  edited.code.replace(edited.code.find("tokens"), 6, "t0kens");
  EXPECT_FALSE(stands_in(edited));
}

}  // namespace
}  // namespace gradnorm
