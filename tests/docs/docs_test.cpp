// The README and the guide in docs/ stay true (README "Where to read next"):
// - the README is at most 300 lines, and every page of docs/ is reachable from it by links;
// - every relative link names a file of the repository, and every #anchor a heading there;
// - every file shown (a TOML, Python, C++ or CMake block) is marked <!-- code: PATH --> and
//   stands verbatim in PATH, a file a test uses;
// - every command shown with its output is marked <!-- command --> and still runs: the same
//   exit status, and the lines after the output's last blank line (its summary) printed as
//   shown. Each check has a negative control below.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/cli.hpp"
#include "support/files.hpp"

namespace gradnorm {
namespace {

namespace fs = std::filesystem;
using testing_support::read_file;

const fs::path kSource = GRADNORM_SOURCE_DIR;

std::vector<fs::path> pages() {
  std::vector<fs::path> out = {"README.md"};
  for (const auto& entry : fs::directory_iterator(kSource / "docs")) {
    if (entry.path().extension() == ".md") out.push_back(fs::path("docs") / entry.path().filename());
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct Block {
  fs::path page;
  std::string marker;    // the <!-- ... --> comment right before the fence, or ""
  std::string language;  // what follows the opening ```
  std::string body;      // up to and including the last newline before the closing fence
};

std::vector<Block> blocks(const fs::path& page, const std::string& text) {
  std::vector<Block> out;
  std::istringstream in(text);
  std::string line, previous;
  while (std::getline(in, line)) {
    const std::size_t indent = line.find_first_not_of(' ');
    if (indent == std::string::npos || line.compare(indent, 3, "```") != 0) {
      if (!line.empty()) previous = line;
      continue;
    }
    Block block{page, "", line.substr(indent + 3), ""};
    const std::string prev = previous.substr(std::min(previous.find_first_not_of(' '), previous.size()));
    if (prev.rfind("<!--", 0) == 0) block.marker = prev;
    while (std::getline(in, line)) {
      const std::size_t at = line.find_first_not_of(' ');
      if (at != std::string::npos && line.compare(at, 3, "```") == 0) break;
      block.body += line.substr(std::min(indent, line.size())) + "\n";
    }
    out.push_back(block);
    previous.clear();
  }
  return out;
}

// GitHub's heading anchors: lower case, punctuation other than '-' and '_' dropped, spaces
// to '-'; a repeated heading gets -1, -2, ...
std::set<std::string> anchors(const std::string& text) {
  std::set<std::string> out;
  std::map<std::string, int> seen;
  std::istringstream in(text);
  std::string line;
  bool fence = false;
  while (std::getline(in, line)) {
    if (line.rfind("```", 0) == 0) fence = !fence;
    if (fence || line.empty() || line[0] != '#') continue;
    const std::size_t title = line.find_first_not_of('#');
    if (title == std::string::npos || line[title] != ' ') continue;
    std::string slug;
    for (unsigned char c : line.substr(title + 1)) {
      if (std::isalnum(c) || c == '-' || c == '_' || c >= 0x80) slug += static_cast<char>(std::tolower(c));
      else if (c == ' ') slug += '-';
    }
    const int n = seen[slug]++;
    out.insert(n == 0 ? slug : slug + "-" + std::to_string(n));
  }
  return out;
}

struct Link {
  fs::path page;
  std::string target;
};

// [text](target) outside code fences and code spans; absolute URLs are not ours to check.
std::vector<Link> links(const fs::path& page, const std::string& text) {
  std::vector<Link> out;
  std::istringstream in(text);
  std::string line;
  bool fence = false;
  while (std::getline(in, line)) {
    if (line.find("```") != std::string::npos && line.find_first_not_of(' ') == line.find("```")) {
      fence = !fence;
      continue;
    }
    if (fence) continue;
    bool span = false;
    for (std::size_t i = 0; i + 1 < line.size(); ++i) {
      if (line[i] == '`') span = !span;
      if (span || line[i] != ']' || line[i + 1] != '(') continue;
      const std::size_t end = line.find(')', i + 2);
      if (end == std::string::npos) break;
      const std::string target = line.substr(i + 2, end - i - 2);
      if (target.find("://") == std::string::npos && target.rfind("mailto:", 0) != 0) {
        out.push_back({page, target});
      }
    }
  }
  return out;
}

// "" when the link resolves, else what is wrong with it.
std::string broken(const Link& link) {
  const std::size_t hash = link.target.find('#');
  const std::string file = link.target.substr(0, hash);
  const fs::path target = file.empty() ? kSource / link.page : (kSource / link.page.parent_path() / file).lexically_normal();
  if (!fs::exists(target)) return link.page.string() + ": link to " + link.target + ": no such file";
  if (hash == std::string::npos) return "";
  if (target.extension() != ".md") return link.page.string() + ": link to " + link.target + ": an anchor into a file that is not Markdown";
  if (anchors(read_file(target.string())).count(link.target.substr(hash + 1)) == 0) {
    return link.page.string() + ": link to " + link.target + ": no such heading there";
  }
  return "";
}

TEST(Docs, TheReadmeIsAtMost300Lines) {
  const std::string readme = read_file((kSource / "README.md").string());
  EXPECT_LE(std::count(readme.begin(), readme.end(), '\n'), 300);
}

TEST(Docs, EveryLinkResolvesToAFileAndAHeading) {
  std::size_t count = 0;
  for (const fs::path& page : pages()) {
    for (const Link& link : links(page, read_file((kSource / page).string()))) {
      ++count;
      EXPECT_EQ(broken(link), "");
    }
  }
  EXPECT_GE(count, 20u) << "the guide lost its links";
}

// Negative control: a missing page and a missing heading are caught.
TEST(Docs, ABrokenLinkOrAnchorIsCaught) {
  EXPECT_NE(broken({"README.md", "docs/no-such-page.md"}), "");
  EXPECT_NE(broken({"README.md", "docs/judging.md#no-such-heading"}), "");
  EXPECT_EQ(broken({"README.md", "docs/judging.md"}), "");
  EXPECT_EQ(anchors("# A page\n## Ranks: the distributed recipes\n## TRL's SFTTrainer, unmodified\n"),
            (std::set<std::string>{"a-page", "ranks-the-distributed-recipes", "trls-sfttrainer-unmodified"}));
}

TEST(Docs, EveryPageIsReachableFromTheReadme) {
  std::set<fs::path> reached = {"README.md"};
  std::vector<fs::path> todo = {"README.md"};
  while (!todo.empty()) {
    const fs::path page = todo.back();
    todo.pop_back();
    for (const Link& link : links(page, read_file((kSource / page).string()))) {
      const std::string file = link.target.substr(0, link.target.find('#'));
      if (file.empty()) continue;
      const fs::path target = (page.parent_path() / file).lexically_normal();
      if (target.extension() == ".md" && fs::exists(kSource / target) && reached.insert(target).second) {
        todo.push_back(target);
      }
    }
  }
  for (const fs::path& page : pages()) EXPECT_TRUE(reached.count(page)) << page << " is linked from no page";
}

struct Command {
  Block block;
  std::string line;                  // its "$ " lines, after the "$ ", joined by "; "
  int status = 0;                    // <!-- command exit=N -->: the last command's
  std::string needs;                 // <!-- command needs=MODULE -->: a package from PyPI
  std::vector<std::string> summary;  // the output's lines after its last blank line
};

std::string option(const std::string& marker, const std::string& key) {
  const std::size_t at = marker.find(" " + key + "=");
  if (at == std::string::npos) return "";
  const std::size_t from = at + key.size() + 2;
  return marker.substr(from, marker.find_first_of(" -", from) - from);
}

std::vector<Command> commands() {
  std::vector<Command> out;
  for (const fs::path& page : pages()) {
    for (const Block& b : blocks(page, read_file((kSource / page).string()))) {
      if (b.marker.rfind("<!-- command", 0) != 0) continue;
      Command c{b, "", 0, option(b.marker, "needs"), {}};
      const std::string status = option(b.marker, "exit");
      if (!status.empty()) c.status = std::stoi(status);
      // Every "$ " line is a command, run in turn in one shell; the rest is their output.
      std::istringstream in(b.body);
      std::string line;
      std::vector<std::string> output;
      bool first = true;
      while (std::getline(in, line)) {
        if (line.rfind("$ ", 0) == 0) {
          c.line += (c.line.empty() ? "" : "; ") + line.substr(2);
        } else if (!first) {
          output.push_back(line);
        }
        if (first && c.line.empty()) break;  // not a command block: differs() says so
        first = false;
      }
      std::size_t start = 0;
      for (std::size_t i = 0; i < output.size(); ++i) {
        if (output[i].empty()) start = i + 1;
      }
      for (std::size_t i = start; i < output.size(); ++i) c.summary.push_back(output[i]);
      out.push_back(c);
    }
  }
  return out;
}

bool is_file_block(const Block& b) {
  static const std::set<std::string> kinds = {"toml", "python", "cpp", "c++", "cmake"};
  return kinds.count(b.language) > 0;
}

std::string code_path(const Block& b) {
  const std::string marker = "<!-- code: ";
  if (b.marker.rfind(marker, 0) != 0) return "";
  return b.marker.substr(marker.size(), b.marker.find(" -->") - marker.size());
}

// "" when the block stands verbatim in its file and a test uses that file.
std::string not_standing(const Block& b, const std::string& used_by_tests) {
  const std::string path = code_path(b);
  if (path.empty()) return b.page.string() + ": a " + b.language + " block without <!-- code: PATH -->:\n" + b.body;
  const std::string file = read_file((kSource / path).string());
  if (file.empty()) return b.page.string() + ": " + path + " is missing or empty";
  if (file.find(b.body) == std::string::npos) return b.page.string() + ": the block marked " + path + " is not in that file:\n" + b.body;
  if (used_by_tests.find(fs::path(path).filename().string()) == std::string::npos) {
    return b.page.string() + ": " + path + " is shown but no test uses it";
  }
  return "";
}

// Every file under tests/ and every CMakeLists.txt, as one text: what the tests name.
std::string what_tests_use() {
  std::string out;
  for (const auto& entry : fs::recursive_directory_iterator(kSource / "tests")) {
    if (entry.is_regular_file()) out += read_file(entry.path().string());
  }
  out += read_file((kSource / "CMakeLists.txt").string());
  for (const auto& top : fs::directory_iterator(kSource)) {
    const std::string name = top.path().filename().string();
    if (!top.is_directory() || name[0] == '.' || name.rfind("build", 0) == 0 || name == "tests") continue;
    for (const auto& entry : fs::recursive_directory_iterator(top.path())) {
      if (entry.path().filename() == "CMakeLists.txt") out += read_file(entry.path().string());
    }
  }
  return out;
}

TEST(Docs, EveryShownFileStandsVerbatimInAFileATestUses) {
  std::string used = what_tests_use();
  for (const Command& c : commands()) used += c.line;  // a shown command runs here too
  std::size_t count = 0;
  for (const fs::path& page : pages()) {
    for (const Block& b : blocks(page, read_file((kSource / page).string()))) {
      if (!is_file_block(b)) continue;
      ++count;
      EXPECT_EQ(not_standing(b, used), "");
    }
  }
  EXPECT_GE(count, 8u) << "the guide lost its marked files";
}

// Negative controls: one changed character, an unmarked block, a file no test names.
TEST(Docs, AnEditedOrUnmarkedBlockIsCaught) {
  const std::string used = what_tests_use();
  std::vector<Block> shown;
  for (const fs::path& page : pages()) {
    for (const Block& b : blocks(page, read_file((kSource / page).string()))) {
      if (is_file_block(b) && b.body.find("tokens") != std::string::npos) shown.push_back(b);
    }
  }
  ASSERT_FALSE(shown.empty());
  Block edited = shown.front();
  ASSERT_EQ(not_standing(edited, used), "");
  edited.body.replace(edited.body.find("tokens"), 6, "t0kens");
  EXPECT_NE(not_standing(edited, used), "");
  Block unmarked = shown.front();
  unmarked.marker.clear();
  EXPECT_NE(not_standing(unmarked, used), "");
  EXPECT_NE(not_standing(shown.front(), "no test names anything"), "");
}

// Runs a shown command where a reader would, in a fresh folder that sees the repository's
// top-level entries (examples/, scripts/, build/, ...), with `gradnorm` the built one; ""
// when its status and summary are as shown.
std::string differs(const Command& c, const testing_support::TemporaryDirectory& folder) {
  if (c.line.empty()) return c.block.page.string() + ": a command block whose first line is not \"$ COMMAND\"";
  for (const auto& entry : fs::directory_iterator(kSource)) {
    const fs::path link = folder.path() / entry.path().filename();
    if (!fs::exists(link)) fs::create_directory_symlink(entry.path(), link);
  }
  const std::string bin = fs::path(GRADNORM_CLI).parent_path().string();
  const testing_support::CliResult r = testing_support::run_shell(
      "cd " + testing_support::shell_quote(folder.path().string()) + " && export PATH=" +
      testing_support::shell_quote(bin) + ":\"$PATH\" && { " + c.line + "; } 2>&1");
  std::string wrong;
  if (r.exit_code != c.status) wrong += "exit " + std::to_string(r.exit_code) + ", shown " + std::to_string(c.status) + "\n";
  for (const std::string& line : c.summary) {
    if (r.output.find(line) == std::string::npos) wrong += "not printed: " + line + "\n";
  }
  if (c.summary.empty()) wrong += "the block shows no summary\n";
  return wrong.empty() ? "" : c.block.page.string() + ": $ " + c.line + "\n" + wrong + "--- it printed:\n" + r.output;
}

bool importable(const std::string& module) {
  return testing_support::run_shell(testing_support::shell_quote(GRADNORM_TEST_PYTHON) + " -c 'import " +
                                    module + "' >/dev/null 2>&1").exit_code == 0;
}

void run_shown(bool frameworks) {
  std::size_t ran = 0;
  std::string missing;
  for (const Command& c : commands()) {
    if (c.needs.empty() == frameworks) continue;
    if (frameworks && !importable(c.needs)) {
      missing += " " + c.needs;
      continue;
    }
    testing_support::TemporaryDirectory folder("gradnorm-docs");
    EXPECT_EQ(differs(c, folder), "");
    ++ran;
  }
  if (!missing.empty()) GTEST_SKIP() << "not installed in " << GRADNORM_TEST_PYTHON << ":" << missing;
  EXPECT_GE(ran, frameworks ? 1u : 3u) << "the guide lost its commands";
}

TEST(Docs, EveryShownCommandStillRunsAndPrintsItsSummary) { run_shown(false); }
TEST(Docs, EveryShownFrameworkCommandStillRunsAndPrintsItsSummary) { run_shown(true); }

// Negative controls: a summary the command does not print, and a status it does not end with.
TEST(Docs, ACommandWhoseSummaryOrStatusChangedIsCaught) {
  std::vector<Command> shown = commands();
  const auto plain = std::find_if(shown.begin(), shown.end(), [](const Command& c) { return c.needs.empty(); });
  ASSERT_NE(plain, shown.end());
  Command changed = *plain;
  changed.summary.back() += " and one more";
  testing_support::TemporaryDirectory folder("gradnorm-docs");
  EXPECT_NE(differs(changed, folder), "");
  changed = *plain;
  changed.status = 7;
  EXPECT_NE(differs(changed, folder), "");
}

}  // namespace
}  // namespace gradnorm
