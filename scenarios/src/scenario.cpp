#include "gradnorm/scenarios/scenario.hpp"
#include "gradnorm/scenarios/scenario_file.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <limits>
#include <numeric>
#include <ostream>
#include <utility>

namespace gradnorm::scenarios {
namespace {

template <typename Enum, std::size_t Size>
using NameTable = std::array<std::pair<Enum, std::string_view>, Size>;

constexpr NameTable<DType, 3> kDTypeNames{{
    {DType::float64, "float64"}, {DType::float32, "float32"}, {DType::bfloat16, "bfloat16"}}};
constexpr NameTable<ModelKind, 6> kModelNames{{{ModelKind::causal_lm, "causal_lm"},
                                               {ModelKind::linear_head, "linear_head"},
                                               {ModelKind::lora, "lora"},
                                               {ModelKind::token_probe, "token_probe"},
                                               {ModelKind::torchscript, "torchscript"},
                                               {ModelKind::python, "python"}}};
constexpr NameTable<LossKind, 3> kLossNames{{{LossKind::mean_ce, "mean_ce"},
                                             {LossKind::chunked_ce, "chunked_ce"},
                                             {LossKind::linear_ce, "linear_ce"}}};
constexpr NameTable<OptimizerKind, 3> kOptimizerNames{{{OptimizerKind::sgd, "sgd"},
                                                       {OptimizerKind::sgd_momentum, "sgd_momentum"},
                                                       {OptimizerKind::adamw, "adamw"}}};
constexpr NameTable<MaskPattern, 3> kMaskNames{{{MaskPattern::trailing_padding, "trailing_padding"},
                                                {MaskPattern::prompt_prefix, "prompt_prefix"},
                                                {MaskPattern::random_holes, "random_holes"}}};

constexpr NameTable<RankAverage, 2> kRankAverageNames{
    {{RankAverage::divide_after_sum, "divide_after_sum"},
     {RankAverage::divide_before_sum, "divide_before_sum"}}};
constexpr NameTable<FirstLabel, 2> kFirstLabelNames{
    {{FirstLabel::masked, "masked"}, {FirstLabel::valid, "valid"}}};

template <typename Enum, std::size_t Size>
std::string_view name_of(const NameTable<Enum, Size>& table, Enum value) {
  for (const auto& [candidate, name] : table) {
    if (candidate == value) return name;
  }
  return "<unknown>";
}

template <typename Enum, std::size_t Size>
Enum parse_name(const NameTable<Enum, Size>& table, std::string_view text, std::string_view what) {
  std::vector<std::string_view> accepted;
  for (const auto& [candidate, name] : table) {
    if (name == text) return candidate;
    accepted.push_back(name);
  }
  throw InvalidInput(fmt::format("unknown {} '{}': expected one of {}", what, text,
                                 fmt::join(accepted, ", ")));
}

// A name as a message can carry it: control characters as \xNN (a NUL would end the
// message, a newline split it).
std::string printable(const std::string& name) {
  std::string out;
  for (char c : name) {
    const auto u = static_cast<unsigned char>(c);
    out += u < 0x20 || u == 0x7f ? fmt::format("\\x{:02x}", u) : std::string(1, c);
  }
  return out;
}

// The largest finite value of each parameter dtype.
double largest_finite(DType dtype) {
  switch (dtype) {
    case DType::float64: return std::numeric_limits<double>::max();
    case DType::float32: return std::numeric_limits<float>::max();
    case DType::bfloat16: return 0x1.fep127;  // 8 exponent bits as float32, 7 mantissa bits
  }
  return 0;
}

void require(bool condition, const Scenario& scenario, std::string_view field,
             const std::string& detail) {
  if (!condition) {
    throw InvalidInput(fmt::format("scenario '{}': {} {}", printable(scenario.name), field, detail));
  }
}

}  // namespace

long Scenario::rank_token_count(int rank) const {
  const auto& row = valid_tokens.at(static_cast<std::size_t>(rank));
  return std::accumulate(row.begin(), row.end(), 0L);
}

MeshCoordinates Scenario::mesh_coordinates(int rank) const {
  MeshCoordinates c;
  c.tp = rank % tp;
  c.cp = (rank / tp) % cp;
  c.dp_shard = (rank / (tp * cp)) % dp_shard();
  c.dp_replicate = rank / (tp * cp * dp_shard());
  c.data_parallel_rank = c.dp_replicate * dp_shard() + c.dp_shard;
  return c;
}

long Scenario::global_token_count() const {
  long total = 0;
  for (int rank = 0; rank < static_cast<int>(valid_tokens.size()); ++rank) {
    total += rank_token_count(rank);
  }
  return total;
}

void validate(const Scenario& s) {
  require(!s.name.empty(), s, "name", "must not be empty");
  // A control character (a newline, a NUL) would cut the terminal table and break the
  // Markdown one; names are printed everywhere, so they are refused at the door.
  for (char c : s.name) {
    const auto u = static_cast<unsigned char>(c);
    require(u >= 0x20 && u != 0x7f, s, "name",
            fmt::format("holds the control character 0x{:02x}; names are printed in tables", u));
  }
  require(s.world_size >= 1 && s.world_size <= 4096, s, "world_size",
          fmt::format("must be in [1, 4096], got {}", s.world_size));
  for (auto [field, size] : {std::pair{"dp_replicate", s.dp_replicate}, std::pair{"tp", s.tp},
                             std::pair{"cp", s.cp}}) {
    require(size >= 1 && size <= s.world_size, s, field,
            fmt::format("must be in [1, world_size={}], got {}", s.world_size, size));
  }
  // In 64 bits: each factor may be 4096, and their product overflows an int (found by the
  // parser's fuzzer).
  const long long mesh = static_cast<long long>(s.dp_replicate) * s.tp * s.cp;
  require(s.world_size % mesh == 0, s, "world_size",
          fmt::format("{} is not dp_replicate {} x dp_shard x cp {} x tp {} for any dp_shard",
                      s.world_size, s.dp_replicate, s.cp, s.tp));
  require(s.cp == 1 || 2 * s.cp <= s.sequence_length, s, "cp",
          fmt::format("cuts each sequence into 2 x {} chunks but it has {} positions", s.cp,
                      s.sequence_length));
  require(s.accumulation_steps >= 1 && s.accumulation_steps <= 1024, s, "accumulation_steps",
          fmt::format("must be in [1, 1024], got {}", s.accumulation_steps));
  require(s.micro_batch_size >= 1 && s.micro_batch_size <= 4096, s, "micro_batch_size",
          fmt::format("must be in [1, 4096], got {}", s.micro_batch_size));
  require(s.sequence_length >= 2 && s.sequence_length <= 65536, s, "sequence_length",
          fmt::format("must be in [2, 65536] (the last position is always ignored), got {}",
                      s.sequence_length));
  require(s.vocab_size >= 2 && s.vocab_size <= 1 << 20, s, "vocab_size",
          fmt::format("must be in [2, 1048576], got {}", s.vocab_size));
  require(s.hidden_size >= 1 && s.hidden_size <= 1 << 16, s, "hidden_size",
          fmt::format("must be in [1, 65536], got {}", s.hidden_size));
  require(s.lora_rank >= 1 && s.lora_rank <= s.hidden_size, s, "lora_rank",
          fmt::format("must be in [1, hidden_size={}], got {}", s.hidden_size, s.lora_rank));
  require(s.loss_chunks >= 1 && s.loss_chunks <= s.sequence_length, s, "loss_chunks",
          fmt::format("must be in [1, sequence_length={}], got {}", s.sequence_length,
                      s.loss_chunks));
  require(std::isfinite(s.learning_rate) && s.learning_rate > 0, s, "learning_rate",
          fmt::format("must be finite and > 0, got {}", s.learning_rate));
  require(std::isfinite(s.momentum) && s.momentum >= 0 && s.momentum < 1, s, "momentum",
          fmt::format("must be in [0, 1), got {}", s.momentum));
  require(std::isfinite(s.weight_decay) && s.weight_decay >= 0, s, "weight_decay",
          fmt::format("must be finite and >= 0, got {}", s.weight_decay));
  // The optimizers scale parameters by these in the parameters' own dtype, where a value past
  // the dtype's largest finite one fails inside a rank ("cannot be converted without
  // overflow"); refused here, before any rank starts.
  const double largest = largest_finite(s.dtype);
  for (auto [field, value] : {std::pair{"learning_rate", s.learning_rate},
                              std::pair{"weight_decay", s.weight_decay}}) {
    require(value <= largest, s, field,
            fmt::format("is {} but {} holds at most {:g}", value, to_string(s.dtype), largest));
  }
  require(s.learning_rate * s.weight_decay <= largest, s, "weight_decay",
          fmt::format("times learning_rate is {:g} (AdamW's decay factor 1 - lr x wd) but {} "
                      "holds at most {:g}",
                      s.learning_rate * s.weight_decay, to_string(s.dtype), largest));
  if (s.clip_max_norm) {
    // 0 is allowed: clip_grad_norm_ then zeroes the gradients, and full_finetune_single_device
    // reads it as "no clipping" (docs/design.md §9).
    require(std::isfinite(*s.clip_max_norm) && *s.clip_max_norm >= 0, s, "clip_max_norm",
            fmt::format("must be finite and >= 0 when set, got {}", *s.clip_max_norm));
  }
  require(model_from_file(s.model) == !s.model_file.empty(), s, "model",
          s.model == ModelKind::torchscript ? std::string("torchscript needs a file: model = \"torchscript:PATH\"")
          : s.model == ModelKind::python
              ? std::string("python needs a file and a function: model = \"python:FILE.py:FUNCTION\"")
              : fmt::format("model_file '{}' is set but the model is {}", s.model_file,
                            to_string(s.model)));
  require((s.model == ModelKind::python) == !s.model_function.empty(), s, "model",
          s.model == ModelKind::python
              ? std::string("python needs a function: model = \"python:FILE.py:FUNCTION\"")
              : fmt::format("model_function '{}' is set but the model is {}", s.model_function,
                            to_string(s.model)));
  require(std::isfinite(s.kd_ratio) && s.kd_ratio >= 0 && s.kd_ratio <= 1, s, "kd_ratio",
          fmt::format("must be in [0, 1], got {}", s.kd_ratio));
  require(s.steps >= 1 && s.steps <= 10000, s, "steps",
          fmt::format("must be in [1, 10000], got {}", s.steps));

  for (const ExpectedVerdict& e : s.expected_verdicts) {
    const bool known = e.verdict == "pass" || e.verdict == "fail" ||
                       e.verdict == "expected-error" || e.verdict == "error-mismatch";
    require(known, s, "expected_verdicts",
            fmt::format("names verdict '{}'; expected pass, fail, expected-error or "
                        "error-mismatch",
                        e.verdict));
    require(!e.variant_pattern.empty() && !e.reason.empty(), s, "expected_verdicts",
            "needs a variant pattern and a reason");
    for (const std::string& check : e.checks) {
      require(std::find(std::begin(kCheckNames), std::end(kCheckNames), check) != std::end(kCheckNames),
              s, "expected_verdicts",
              fmt::format("for '{}' names the check '{}'; expected some of {}", e.variant_pattern,
                          check, fmt::join(kCheckNames, ", ")));
    }
    const bool names_error = std::find(e.checks.begin(), e.checks.end(), "error-behaviour") != e.checks.end();
    if (e.verdict == "fail") {
      require(!e.checks.empty() && !names_error, s, "expected_verdicts",
              fmt::format("for '{}' is a fail: name the checks it fails (checks = [...], some of "
                          "{}), so that any other failure on the row is caught",
                          e.variant_pattern, fmt::join(std::begin(kCheckNames), std::end(kCheckNames) - 1, ", ")));
    } else if (e.verdict == "error-mismatch") {
      require(e.checks.empty() || (e.checks.size() == 1 && names_error), s, "expected_verdicts",
              fmt::format("for '{}' is an error-mismatch, which fails error-behaviour alone",
                          e.variant_pattern));
    } else {
      require(e.checks.empty(), s, "expected_verdicts",
              fmt::format("for '{}' is {}, which fails no check", e.variant_pattern, e.verdict));
    }
  }
  require(static_cast<int>(s.valid_tokens.size()) == s.data_parallel_size(), s, "valid_tokens",
          s.has_mesh()
              ? fmt::format("has {} rows but the mesh has {} data-parallel ranks (world_size {} "
                            "/ (tp {} x cp {}))",
                            s.valid_tokens.size(), s.data_parallel_size(), s.world_size, s.tp, s.cp)
              : fmt::format("has {} rank rows but world_size is {}", s.valid_tokens.size(),
                            s.world_size));
  const int capacity = s.micro_batch_capacity();
  for (std::size_t rank = 0; rank < s.valid_tokens.size(); ++rank) {
    const auto& row = s.valid_tokens[rank];
    require(static_cast<int>(row.size()) == s.accumulation_steps, s, "valid_tokens",
            fmt::format("rank {} has {} micro-batches but accumulation_steps is {}", rank,
                        row.size(), s.accumulation_steps));
    for (std::size_t micro = 0; micro < row.size(); ++micro) {
      require(row[micro] >= 0, s, "valid_tokens",
              fmt::format("rank {} micro-batch {} asks for {} valid tokens; counts must be >= 0",
                          rank, micro, row[micro]));
      require(row[micro] <= capacity, s, "valid_tokens",
              fmt::format("rank {} micro-batch {} asks for {} valid tokens but holds {} "
                          "positions (micro_batch_size {} x (sequence_length {} - 1)); raise "
                          "sequence_length or micro_batch_size",
                          rank, micro, row[micro], capacity, s.micro_batch_size,
                          s.sequence_length));
    }
  }
}

double parameter_elements(const Scenario& s) {
  const double v = s.vocab_size, h = s.hidden_size, r = s.lora_rank;
  switch (s.model) {
    case ModelKind::token_probe:
      return static_cast<double>(s.world_size) * s.accumulation_steps * s.micro_batch_size *
             s.sequence_length * v;
    case ModelKind::linear_head: return v * h + v;
    case ModelKind::causal_lm: return 2 * v * h + h * h + h + v;
    case ModelKind::lora: return 2 * v * h + h * h + h + v + 3 * r * h + v * r;
    case ModelKind::torchscript: {
      std::error_code error;
      const std::uintmax_t bytes = std::filesystem::file_size(s.model_file, error);
      return error ? 0.0 : static_cast<double>(bytes) / 4;
    }
    case ModelKind::python: return 0;  // known only once the function has built it
  }
  return 0;
}

double estimate_memory_bytes(const Scenario& s, int ranks_in_process, std::optional<double> elements) {
  // Measured peaks (RelWithDebInfo, ranks as threads): about 190 MB for LibTorch and a tiny
  // scenario; 287 bytes per float32 parameter element with one rank, 748 with four, 436 per
  // float64 element with one rank; 28 bytes per float32 logit of a micro-batch. The factors
  // below sit above each of those.
  const double width = s.dtype == DType::float64 ? 8 : 4;  // bfloat16 computes in float32
  const double shared_per_element = 16 * width + 80;   // the draw cache, the oracle's float64 copies
  const double per_rank_per_element = 24 * width + 64;  // parameters, gradients, optimizer, snapshots
  const double per_rank_activations = static_cast<double>(s.micro_batch_size) * s.sequence_length *
                                      (s.vocab_size + 4.0 * s.hidden_size) * (4 * width + 16);
  const double ranks = ranks_in_process;
  return 256.0 * (1 << 20) +
         elements.value_or(parameter_elements(s)) * (shared_per_element + ranks * per_rank_per_element) +
         ranks * per_rank_activations;
}

std::string model_name(const Scenario& s) {
  switch (s.model) {
    case ModelKind::torchscript: return "torchscript:" + s.model_file;
    case ModelKind::python: return fmt::format("python:{}:{}", s.model_file, s.model_function);
    default: return std::string(to_string(s.model));
  }
}

std::string describe(const Scenario& s) {
  std::string counts = fmt::format("{}", s.valid_tokens);
  std::string clip = s.clip_max_norm ? fmt::format("{}", *s.clip_max_norm) : "none";
  return fmt::format(
      "{} W={} A={} counts={} B={} T={} mask={} V={} H={} dtype={} model={} loss={} opt={} "
      "lr={} clip={} in_bwd={} steps={} seed={} lora_rank={} chunks={} momentum={} wd={}{}{}{}{}",
      s.name, s.world_size, s.accumulation_steps, counts, s.micro_batch_size, s.sequence_length,
      to_string(s.mask), s.vocab_size, s.hidden_size, to_string(s.dtype),
      model_name(s),
      to_string(s.loss), to_string(s.optimizer), s.learning_rate, clip, s.optimizer_in_backward,
      s.steps, s.seed, s.lora_rank, s.loss_chunks, s.momentum, s.weight_decay,
      s.world_size > 1 ? fmt::format(" average={}", to_string(s.rank_average)) : std::string(),
      s.kd_ratio != 0.5 ? fmt::format(" kd_ratio={}", s.kd_ratio) : std::string(),
      s.first_label != FirstLabel::masked ? fmt::format(" first_label={}", to_string(s.first_label))
                                          : std::string(),
      s.has_mesh() ? fmt::format(" mesh=dp_replicate:{},dp_shard:{},cp:{},tp:{}", s.dp_replicate,
                                 s.dp_shard(), s.cp, s.tp)
                   : std::string());
}

std::ostream& operator<<(std::ostream& out, const Scenario& scenario) {
  // A counter-example must be replayable: the line, then the file that runs it again.
  return out << describe(scenario) << "\nreplay it as a scenario file (gradnorm run -f FILE):\n"
             << scenario_table(scenario);
}

std::string_view to_string(DType value) { return name_of(kDTypeNames, value); }
std::string_view to_string(ModelKind value) { return name_of(kModelNames, value); }
std::string_view to_string(LossKind value) { return name_of(kLossNames, value); }
std::string_view to_string(OptimizerKind value) { return name_of(kOptimizerNames, value); }
std::string_view to_string(MaskPattern value) { return name_of(kMaskNames, value); }
std::string_view to_string(RankAverage value) { return name_of(kRankAverageNames, value); }
std::string_view to_string(FirstLabel value) { return name_of(kFirstLabelNames, value); }

DType parse_dtype(std::string_view text) { return parse_name(kDTypeNames, text, "dtype"); }
ModelKind parse_model_kind(std::string_view text) {
  return parse_name(kModelNames, text, "model");
}
LossKind parse_loss_kind(std::string_view text) { return parse_name(kLossNames, text, "loss"); }
OptimizerKind parse_optimizer_kind(std::string_view text) {
  return parse_name(kOptimizerNames, text, "optimizer");
}
MaskPattern parse_mask_pattern(std::string_view text) {
  return parse_name(kMaskNames, text, "mask");
}
RankAverage parse_rank_average(std::string_view text) {
  return parse_name(kRankAverageNames, text, "rank_average");
}
FirstLabel parse_first_label(std::string_view text) {
  return parse_name(kFirstLabelNames, text, "first_label");
}

}  // namespace gradnorm::scenarios
