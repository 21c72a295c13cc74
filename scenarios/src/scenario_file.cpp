#include "gradnorm/scenarios/scenario_file.hpp"

#include "gradnorm/scenarios/files.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <fstream>
#include <set>

namespace gradnorm::scenarios {
namespace {

class Reader {
 public:
  Reader(const toml::table& table, std::string where, std::string kind = "scenario field")
      : table_(table), where_(std::move(where)), kind_(std::move(kind)) {}

  [[noreturn]] void fail(std::string_view key, const std::string& detail) const {
    throw InvalidInput(fmt::format("{}: {} {}", where_, key, detail));
  }

  template <typename T>
  void read(std::string_view key, T& out, std::string_view expected) {
    used_.insert(std::string(key));
    const toml::node* node = table_.get(key);
    if (node == nullptr) return;
    const std::optional<T> value = node->value_exact<T>();
    if (!value) fail(key, fmt::format("must be {}", expected));
    out = *value;
  }

  void read_int(std::string_view key, int& out) {
    std::int64_t value = out;
    read(key, value, "an integer");
    if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
      fail(key, fmt::format("is out of range: {}", value));
    }
    out = static_cast<int>(value);
  }

  void read_double(std::string_view key, double& out) {
    used_.insert(std::string(key));
    const toml::node* node = table_.get(key);
    if (node == nullptr) return;
    if (auto v = node->value_exact<double>()) {
      out = *v;
    } else if (auto i = node->value_exact<std::int64_t>()) {
      out = static_cast<double>(*i);
    } else {
      fail(key, "must be a number");
    }
  }

  template <typename Enum>
  void read_enum(std::string_view key, Enum& out, Enum (*parse)(std::string_view)) {
    std::string text;
    read(key, text, "a string");
    if (text.empty()) {
      // Absent keeps the default; present and empty is a mistake, not a default.
      if (table_.get(key) != nullptr) fail(key, "must not be empty");
      return;
    }
    try {
      out = parse(text);
    } catch (const InvalidInput& error) {
      fail(key, fmt::format("is invalid: {}", error.what()));
    }
  }

  [[nodiscard]] const toml::node* node(std::string_view key) {
    used_.insert(std::string(key));
    return table_.get(key);
  }

  // Keys nobody asked for are typos: reject them by name.
  void reject_unknown() const {
    for (const auto& [key, value] : table_) {
      if (!used_.count(std::string(key.str()))) {
        std::vector<std::string> known(used_.begin(), used_.end());
        fail(key.str(), fmt::format("is not a {} (known: {})", kind_, fmt::join(known, ", ")));
      }
    }
  }

 private:
  const toml::table& table_;
  std::string where_;
  std::string kind_;
  std::set<std::string> used_;
};

// model = "causal_lm" (a built-in), "torchscript:PATH" or "python:FILE.py:FUNCTION"; a
// relative file is relative to the scenario file's folder.
void read_model(Reader& r, Scenario& s, const std::string& source) {
  std::string text;
  r.read(std::string_view("model"), text, "a string");
  auto beside_source = [&](std::filesystem::path file) {
    if (file.is_relative()) file = std::filesystem::path(source).parent_path() / file;
    return file.lexically_normal().string();
  };
  constexpr std::string_view kScripted = "torchscript:";
  if (text.rfind(kScripted, 0) == 0) {
    std::filesystem::path file(text.substr(kScripted.size()));
    if (file.empty()) r.fail("model", "names no file: expected \"torchscript:PATH\"");
    s.model = ModelKind::torchscript;
    s.model_file = beside_source(file);
    return;
  }
  constexpr std::string_view kPython = "python:";
  if (text.rfind(kPython, 0) == 0) {
    // FILE.py:FUNCTION, split at the first colon after the file's last '/'.
    const std::string rest = text.substr(kPython.size());
    const auto slash = rest.find_last_of('/');
    const auto colon = rest.find(':', slash == std::string::npos ? 0 : slash);
    const std::string file = rest.substr(0, colon);
    const std::string function = colon == std::string::npos ? "" : rest.substr(colon + 1);
    if (file.empty()) r.fail("model", "names no file: expected \"python:FILE.py:FUNCTION\"");
    if (function.empty()) {
      r.fail("model", fmt::format("names no function in '{}': expected \"python:FILE.py:FUNCTION\"",
                                  file));
    }
    s.model = ModelKind::python;
    s.model_file = beside_source(file);
    s.model_function = function;
    return;
  }
  if (text == "torchscript") r.fail("model", "needs a file: \"torchscript:PATH\"");
  if (text == "python") r.fail("model", "needs a file and a function: \"python:FILE.py:FUNCTION\"");
  if (text.empty()) {
    if (r.node("model") != nullptr) r.fail("model", "must not be empty");
    return;
  }
  try {
    s.model = parse_model_kind(text);
  } catch (const InvalidInput& error) {
    r.fail("model", fmt::format("is invalid: {} (or \"torchscript:PATH\", \"python:FILE.py:FUNCTION\")",
                                error.what()));
  }
}

Scenario read_scenario(const toml::table& table, const std::string& where,
                       const std::string& source) {
  Scenario s;
  Reader r(table, where);
  r.read(std::string_view("name"), s.name, "a string");
  r.read_int("world_size", s.world_size);
  r.read_int("accumulation_steps", s.accumulation_steps);
  r.read_int("dp_replicate", s.dp_replicate);
  r.read_int("tp", s.tp);
  r.read_int("cp", s.cp);
  r.read_int("micro_batch_size", s.micro_batch_size);
  r.read_int("sequence_length", s.sequence_length);
  r.read_int("vocab_size", s.vocab_size);
  r.read_int("hidden_size", s.hidden_size);
  r.read_int("lora_rank", s.lora_rank);
  r.read_int("loss_chunks", s.loss_chunks);
  r.read_int("steps", s.steps);
  r.read_enum("mask", s.mask, parse_mask_pattern);
  r.read_enum("first_label", s.first_label, parse_first_label);
  r.read_enum("dtype", s.dtype, parse_dtype);
  read_model(r, s, source);
  r.read_enum("loss", s.loss, parse_loss_kind);
  r.read_enum("optimizer", s.optimizer, parse_optimizer_kind);
  r.read_enum("rank_average", s.rank_average, parse_rank_average);
  r.read_double("learning_rate", s.learning_rate);
  r.read_double("momentum", s.momentum);
  r.read_double("weight_decay", s.weight_decay);
  r.read_double("kd_ratio", s.kd_ratio);
  r.read(std::string_view("optimizer_in_backward"), s.optimizer_in_backward, "true or false");
  std::int64_t seed = static_cast<std::int64_t>(s.seed);
  r.read(std::string_view("seed"), seed, "an integer");
  if (seed < 0) r.fail("seed", fmt::format("must be >= 0, got {}", seed));
  s.seed = static_cast<std::uint64_t>(seed);
  if (const toml::node* clip = r.node("clip_max_norm")) {
    if (auto v = clip->value<double>()) {
      s.clip_max_norm = *v;
    } else {
      r.fail("clip_max_norm", "must be a number");
    }
  }
  if (const toml::node* counts = r.node("valid_tokens")) {
    const toml::array* ranks = counts->as_array();
    if (ranks == nullptr) r.fail("valid_tokens", "must be an array of arrays, e.g. [[5], [3]]");
    s.valid_tokens.clear();
    for (const toml::node& rank : *ranks) {
      const toml::array* micro = rank.as_array();
      if (micro == nullptr) r.fail("valid_tokens", "must be an array of arrays, e.g. [[5], [3]]");
      // An empty rank used to read as accumulation_steps = 0 and be blamed on that field.
      if (micro->empty()) {
        r.fail("valid_tokens", fmt::format("rank {} holds no micro-batch ([]): each rank needs one "
                                           "count per micro-batch, e.g. [[5], [3]]",
                                           s.valid_tokens.size()));
      }
      std::vector<int> row;
      for (const toml::node& count : *micro) {
        const std::optional<std::int64_t> value = count.value_exact<std::int64_t>();
        if (!value) r.fail("valid_tokens", "must hold integers");
        // Checked before narrowing: 4294967301 must not run as 5.
        if (*value < 0 || *value > std::numeric_limits<int>::max()) {
          r.fail("valid_tokens", fmt::format("holds {}, out of range [0, {}]", *value,
                                             std::numeric_limits<int>::max()));
        }
        row.push_back(static_cast<int>(*value));
      }
      s.valid_tokens.push_back(std::move(row));
    }
  }
  if (const toml::node* expect = r.node("expect")) {
    const toml::array* list = expect->as_array();
    if (list == nullptr) r.fail("expect", "must be an array of tables ([[scenario.expect]])");
    for (const toml::node& entry : *list) {
      const toml::table* e = entry.as_table();
      if (e == nullptr) r.fail("expect", "must be an array of tables ([[scenario.expect]])");
      ExpectedVerdict finding;
      Reader er(*e, where + " expect", "expect field");
      er.read(std::string_view("variant"), finding.variant_pattern, "a string");
      er.read(std::string_view("verdict"), finding.verdict, "a string");
      er.read(std::string_view("reason"), finding.reason, "a string");
      if (const toml::node* checks = er.node("checks")) {
        const toml::array* names = checks->as_array();
        if (names == nullptr) er.fail("checks", "must be an array of check names");
        for (const toml::node& name : *names) {
          const std::optional<std::string> text = name.value_exact<std::string>();
          if (!text) er.fail("checks", "must be an array of check names (strings)");
          finding.checks.push_back(*text);
        }
      }
      er.reject_unknown();
      s.expected_verdicts.push_back(std::move(finding));
    }
  }
  r.reject_unknown();
  return s;
}

// [[variant]] tables: where the Python step is, resolved against the file's folder.
std::vector<VariantDeclaration> read_variants(const toml::table& root, const std::string& source) {
  std::vector<VariantDeclaration> out;
  const toml::node* node = root.get("variant");
  if (node == nullptr) return out;
  const toml::array* list = node->as_array();
  if (list == nullptr) throw InvalidInput(fmt::format("{}: variant must be [[variant]] tables", source));
  std::set<std::string> names;
  for (std::size_t i = 0; i < list->size(); ++i) {
    const toml::table* table = (*list)[i].as_table();
    const std::string where = fmt::format("{}: variant #{}", source, i + 1);
    if (table == nullptr) throw InvalidInput(fmt::format("{} is not a table", where));
    VariantDeclaration v;
    v.where = where;
    Reader r(*table, where, "variant field");
    r.read(std::string_view("name"), v.name, "a string");
    r.read(std::string_view("python"), v.python, "a string (FILE.py or FILE.py:FUNCTION)");
    r.read(std::string_view("role"), v.role, "a string");
    r.read(std::string_view("reference"), v.reference, "a string");
    r.read(std::string_view("findings_of"), v.findings_of, "a string");
    r.read(std::string_view("recipe"), v.recipe,
           "a string (torchtune:NAME, torchtune:PATH.py, transformers:trainer, "
           "transformers:PATH.py:NAME, trl:sft or trl:PATH.py:NAME)");
    if (const toml::node* args = r.node("recipe_args")) {
      const toml::array* items = args->as_array();
      if (items == nullptr) r.fail("recipe_args", "must be an array of \"KEY=VALUE\" strings");
      for (const toml::node& item : *items) {
        const std::optional<std::string> text = item.value_exact<std::string>();
        if (!text) r.fail("recipe_args", "must be an array of \"KEY=VALUE\" strings");
        v.recipe_args.push_back(*text);
      }
    }
    r.reject_unknown();
    if (v.name.empty()) r.fail("name", "is missing");
    if (!v.python.empty() && !v.recipe.empty()) {
      r.fail("recipe", "and python both given: a variant is a Python step or a recipe");
    }
    if (v.python.empty() && v.recipe.empty()) {
      r.fail("python", "is missing: the step's file, FILE.py[:FUNCTION] (or recipe = "
                       "\"torchtune:NAME\")");
    }
    if (v.recipe.empty() && !v.recipe_args.empty()) r.fail("recipe_args", "needs a recipe");
    const auto beside = [&source](const std::string& path) {
      std::filesystem::path file(path);
      return file.is_relative() ? (std::filesystem::path(source).parent_path() / file).lexically_normal().string()
                                : path;
    };
    if (!v.python.empty()) v.python = beside(v.python);
    // FRAMEWORK:PATH.py or transformers:PATH.py:NAME: the path is the file's neighbour.
    if (const auto colon = v.recipe.find(':'); colon != std::string::npos) {
      const auto py = v.recipe.rfind(".py");
      if (py != std::string::npos && py > colon &&
          (py + 3 == v.recipe.size() || v.recipe[py + 3] == ':')) {
        v.recipe = v.recipe.substr(0, colon + 1) + beside(v.recipe.substr(colon + 1, py + 2 - colon)) +
                   v.recipe.substr(py + 3);
      }
    }
    if (!names.insert(v.name).second) {
      throw InvalidInput(fmt::format("{}: variant name '{}' appears twice", source, v.name));
    }
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace

ScenarioFile parse_scenario_file(const std::string& text, const std::string& source) {
  // TOML allows no NUL anywhere; refused here, before the TOML parser sees it (found by the
  // fuzzer: "[" then NUL).
  if (const std::size_t nul = text.find('\0'); nul != std::string::npos) {
    const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<long>(nul), '\n');
    throw InvalidInput(fmt::format("{}:{}: not valid TOML: a NUL byte (is this a text file?)", source, line));
  }
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& error) {
    const auto& where = error.source().begin;
    throw InvalidInput(fmt::format("{}:{}:{}: not valid TOML: {}", source, where.line,
                                   where.column, error.description()));
  }
  for (const auto& [key, value] : root) {
    if (key.str() != "scenario" && key.str() != "variant") {
      throw InvalidInput(fmt::format("{}: unexpected top-level key '{}': scenarios go in "
                                     "[[scenario]] tables, Python steps in [[variant]] tables",
                                     source, key.str()));
    }
  }
  ScenarioFile out;
  out.variants = read_variants(root, source);
  const toml::node* scenario_node = root.get("scenario");
  const toml::array* list = scenario_node ? scenario_node->as_array() : nullptr;
  if (scenario_node != nullptr && list == nullptr) {
    throw InvalidInput(fmt::format("{}: scenario must be [[scenario]] tables", source));
  }
  if ((list == nullptr || list->empty()) && out.variants.empty()) {
    throw InvalidInput(fmt::format("{}: no [[scenario]] or [[variant]] table", source));
  }
  std::set<std::string> names;
  for (std::size_t i = 0; list != nullptr && i < list->size(); ++i) {
    const toml::table* table = (*list)[i].as_table();
    if (table == nullptr) throw InvalidInput(fmt::format("{}: scenario #{} is not a table", source, i + 1));
    Scenario s = read_scenario(*table, fmt::format("{}: scenario #{}", source, i + 1), source);
    if (s.name.empty()) {
      throw InvalidInput(fmt::format("{}: scenario #{}: name is missing", source, i + 1));
    }
    // A counts table sets the window shape when the shape is not given explicitly.
    // One row per data-parallel rank: tensor- and context-parallel ranks multiply it.
    if (!table->contains("world_size")) {
      // In 64 bits, then range-checked: tp x cp alone may pass an int (found by the fuzzer).
      const long long world = static_cast<long long>(s.valid_tokens.size()) * s.tp * s.cp;
      if (world > 4096) {
        throw InvalidInput(fmt::format("{}: scenario #{}: world_size is not given and the counts "
                                       "imply {} rows x tp {} x cp {} = {} ranks, more than 4096",
                                       source, i + 1, s.valid_tokens.size(), s.tp, s.cp, world));
      }
      s.world_size = static_cast<int>(world);
    }
    if (!table->contains("accumulation_steps") && !s.valid_tokens.empty()) {
      s.accumulation_steps = static_cast<int>(s.valid_tokens.front().size());
    }
    try {
      validate(s);
    } catch (const InvalidInput& error) {
      throw InvalidInput(fmt::format("{}: {}", source, error.what()));
    }
    if (!names.insert(s.name).second) {
      throw InvalidInput(fmt::format("{}: scenario name '{}' appears twice", source, s.name));
    }
    out.scenarios.push_back(std::move(s));
  }
  return out;
}

namespace {

// A TOML basic string: quotes, backslashes and control characters escaped.
std::string toml_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\u{:04x}", u);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

std::string scenario_table(const Scenario& s) {
  std::string out = "[[scenario]]\n";
  auto line = [&out](std::string_view key, const std::string& value) {
    out += fmt::format("{} = {}\n", key, value);
  };
  line("name", toml_string(s.name));
  line("world_size", fmt::format("{}", s.world_size));
  line("dp_replicate", fmt::format("{}", s.dp_replicate));
  line("tp", fmt::format("{}", s.tp));
  line("cp", fmt::format("{}", s.cp));
  line("accumulation_steps", fmt::format("{}", s.accumulation_steps));
  line("valid_tokens", fmt::format("{}", s.valid_tokens));
  line("micro_batch_size", fmt::format("{}", s.micro_batch_size));
  line("sequence_length", fmt::format("{}", s.sequence_length));
  line("mask", toml_string(to_string(s.mask)));
  // Written only when it is not the default, so tables written before the field existed
  // read back the same.
  if (s.first_label != FirstLabel::masked) line("first_label", toml_string(to_string(s.first_label)));
  line("vocab_size", fmt::format("{}", s.vocab_size));
  line("hidden_size", fmt::format("{}", s.hidden_size));
  line("lora_rank", fmt::format("{}", s.lora_rank));
  line("loss_chunks", fmt::format("{}", s.loss_chunks));
  line("dtype", toml_string(to_string(s.dtype)));
  line("model", toml_string(
                    s.model == ModelKind::torchscript
                        ? "torchscript:" + std::filesystem::absolute(s.model_file).string()
                    : s.model == ModelKind::python
                        ? fmt::format("python:{}:{}", std::filesystem::absolute(s.model_file).string(),
                                      s.model_function)
                        : std::string(to_string(s.model))));
  line("loss", toml_string(to_string(s.loss)));
  line("optimizer", toml_string(to_string(s.optimizer)));
  // Doubles as their shortest round-trip form: read back, each is the same double.
  line("learning_rate", fmt::format("{}", s.learning_rate));
  line("momentum", fmt::format("{}", s.momentum));
  line("weight_decay", fmt::format("{}", s.weight_decay));
  if (s.clip_max_norm) line("clip_max_norm", fmt::format("{}", *s.clip_max_norm));
  line("rank_average", toml_string(to_string(s.rank_average)));
  line("optimizer_in_backward", s.optimizer_in_backward ? "true" : "false");
  line("steps", fmt::format("{}", s.steps));
  line("kd_ratio", fmt::format("{}", s.kd_ratio));
  line("seed", fmt::format("{}", s.seed));
  for (const ExpectedVerdict& e : s.expected_verdicts) {
    out += "[[scenario.expect]]\n";
    line("variant", toml_string(e.variant_pattern));
    line("verdict", toml_string(e.verdict));
    line("reason", toml_string(e.reason));
    if (!e.checks.empty()) {
      std::vector<std::string> names;
      for (const std::string& check : e.checks) names.push_back(toml_string(check));
      line("checks", fmt::format("[{}]", fmt::join(names, ", ")));
    }
  }
  return out;
}

std::vector<Scenario> parse_scenarios(const std::string& text, const std::string& source) {
  ScenarioFile file = parse_scenario_file(text, source);
  if (file.scenarios.empty()) throw InvalidInput(fmt::format("{}: no [[scenario]] table", source));
  return std::move(file.scenarios);
}

ScenarioFile load_scenario_file_contents(const std::string& path) {
  // Asked before opening (files.hpp): opening a FIFO blocks until a writer comes, and
  // /dev/zero never ends.
  const std::string text = read_regular_file(path, kMaxScenarioFileBytes, "scenario file");
  return parse_scenario_file(text, path);
}

std::vector<Scenario> load_scenario_file(const std::string& path) {
  ScenarioFile contents = load_scenario_file_contents(path);
  if (contents.scenarios.empty()) throw InvalidInput(fmt::format("{}: no [[scenario]] table", path));
  return std::move(contents.scenarios);
}

}  // namespace gradnorm::scenarios
