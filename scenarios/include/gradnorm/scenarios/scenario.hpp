#pragma once
// One optimizer step described as plain data. No torch here: this header is cheap to
// include and a scenario reads the same in a test, a file and a report.

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace gradnorm::scenarios {

// Bad user input: a malformed scenario, an impossible count, an unknown name. The message
// says what was wrong, what was expected and what was found.
class InvalidInput : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class DType { float64, float32, bfloat16 };
// token_probe: one parameter row per token position of the step, starting at zero, so each
// token's gradient lands in its own row and its effective weight can be read off exactly.
// torchscript: a scripted module from a file (model_file), token ids [B, T] -> logits
// [B, T, V], trained as it is.
// python: the torch.nn.Module a function in a Python file returns (model_file,
// model_function), called with vocab_size, hidden_size and sequence_length; trained as it is.
enum class ModelKind { causal_lm, linear_head, lora, token_probe, torchscript, python };

// The models that come from a user's file, trained as they are (no LoRA, no fake
// quantisation, no teacher): TorchScript archives and Python functions.
[[nodiscard]] constexpr bool model_from_file(ModelKind kind) {
  return kind == ModelKind::torchscript || kind == ModelKind::python;
}
// How the loss forms its mean; decides what an all-masked batch does (docs/design.md §1).
//   mean_ce   : PyTorch cross_entropy(reduction=mean): NaN value, zero gradients.
//   chunked_ce: sum of per-chunk CE sums / total valid count: NaN value (0/0), zero
//               gradients (measured).
//   linear_ce : returns a graph-less zero when nothing is valid, so backward raises.
enum class LossKind { mean_ce, chunked_ce, linear_ce };
enum class OptimizerKind { sgd, sgd_momentum, adamw };
// How gradients are averaged over ranks (LibTorch 1.13's Gloo has no AVG): SUM then divide
// by W, or divide by W then SUM. Equal in exact arithmetic; they round differently.
enum class RankAverage { divide_after_sum, divide_before_sum };
// Where the ignored (-100) positions sit inside a sequence.
enum class MaskPattern { trailing_padding, prompt_prefix, random_holes };
// The label at position 0 of each sequence, as a recipe that receives labels aligned with
// its tokens sees it (torchtune 0.6.1's recipes and Hugging Face shift them themselves): the
// shift drops it, so it never enters the loss, but a count taken before the shift sees it.
//   masked: -100 (a masked prompt; what every scenario meant before the field existed).
//   valid : a token id (training on the input).
enum class FirstLabel { masked, valid };

// A documented finding: on this scenario, variants matching `variant_pattern` (shell-style)
// are known to end with `verdict` ("fail", "error-mismatch", ...) for the stated reason. A run
// that no longer reproduces it says so, so the note cannot go stale silently.
//
// `checks` names the checks the finding fails. Nothing else may fail on the row, past what
// follows from them (a wrong gradient makes a wrong update and a wrong clipped norm; a wrong
// norm clips the update wrongly; past the first step a wrong update moves every later
// number): a second bug on a finding's row cannot hide behind the first. A "fail" names at
// least one; an "error-mismatch" fails error-behaviour alone (the default); "pass" and
// "expected-error" fail none.
struct ExpectedVerdict {
  std::string variant_pattern;
  std::string verdict;
  std::string reason;
  std::vector<std::string> checks{};
};

// The checks a verdict is made of, by the names findings and reports use: every step ran,
// gradients, the parameter update, the logged loss, the clipped gradient norm, replicas
// agreeing bit for bit, and the error contract (raising, N = 0).
inline constexpr std::string_view kCheckNames[] = {
    "steps", "gradients", "parameter-update", "logged-loss", "grad-norm", "ranks-agree",
    "error-behaviour"};

// Where a rank sits on torchtune's device mesh ("dp_replicate", "dp_shard", "cp", "tp"),
// tp varying fastest.
struct MeshCoordinates {
  int dp_replicate = 0;
  int dp_shard = 0;
  int cp = 0;
  int tp = 0;
  int data_parallel_rank = 0;  // dp_replicate * dp_shard_size + dp_shard: whose batch it sees
};

struct Scenario {
  std::string name;
  // Every rank of the mesh: dp_replicate * dp_shard * cp * tp.
  int world_size = 1;
  // The mesh (docs/design.md §7). dp_shard is what the others leave of world_size. Ranks that
  // differ only in tp see the same tokens; cp ranks split each sequence into contiguous
  // shards; FSDP averages gradients over every rank with the same tp coordinate.
  int dp_replicate = 1;
  int tp = 1;
  int cp = 1;
  int accumulation_steps = 1;
  // valid_tokens[data-parallel rank][micro_batch]: how many labels of that micro-batch are
  // not -100 (one row per rank when there is no tensor or context parallelism).
  std::vector<std::vector<int>> valid_tokens{{5}};
  int micro_batch_size = 2;  // sequences per micro-batch
  int sequence_length = 8;   // positions per sequence; the last one is always ignored
  MaskPattern mask = MaskPattern::trailing_padding;
  FirstLabel first_label = FirstLabel::masked;
  int vocab_size = 11;
  int hidden_size = 6;
  int lora_rank = 2;
  int loss_chunks = 2;  // chunks of the chunked loss along the sequence
  DType dtype = DType::float32;
  ModelKind model = ModelKind::causal_lm;
  std::string model_file;      // the TorchScript archive or the Python file (model_from_file)
  std::string model_function;  // the function in model_file that builds a python model
  LossKind loss = LossKind::mean_ce;
  OptimizerKind optimizer = OptimizerKind::sgd;
  double learning_rate = 0.5;
  double momentum = 0.9;       // used by sgd_momentum
  double weight_decay = 0.0;   // used by every optimizer
  std::optional<double> clip_max_norm;
  RankAverage rank_average = RankAverage::divide_after_sum;
  bool optimizer_in_backward = false;
  int steps = 1;
  // Knowledge distillation: the weight of the KD loss against the class loss (torchtune's
  // kd_ratio); only recipes that distil from a teacher read it.
  double kd_ratio = 0.5;
  std::uint64_t seed = 0;
  std::vector<ExpectedVerdict> expected_verdicts;

  // Sum over micro-batches of one data-parallel rank.
  [[nodiscard]] long rank_token_count(int rank) const;
  // dp_replicate * dp_shard: the ranks that see different batches (valid_tokens rows).
  [[nodiscard]] int data_parallel_size() const { return world_size / (tp * cp); }
  [[nodiscard]] int dp_shard() const { return data_parallel_size() / dp_replicate; }
  [[nodiscard]] bool has_mesh() const { return dp_replicate > 1 || tp > 1 || cp > 1; }
  [[nodiscard]] MeshCoordinates mesh_coordinates(int rank) const;
  // N: every valid token of one step, all ranks and micro-batches.
  [[nodiscard]] long global_token_count() const;
  // Positions that can hold a valid label in one micro-batch.
  [[nodiscard]] int micro_batch_capacity() const {
    return micro_batch_size * (sequence_length - 1);
  }
};

// Throws InvalidInput naming the field and the offending values.
void validate(const Scenario& scenario);

// Trainable and frozen parameter elements of the scenario's model, per rank (a TorchScript
// model's from its archive's size, at four bytes an element; a Python model's are known
// only once its function has run, and count as none here: harness::model_parameter_elements
// builds it).
[[nodiscard]] double parameter_elements(const Scenario& scenario);
// An upper estimate, in bytes, of the memory one process takes to run the scenario with
// `ranks_in_process` of its ranks in it (all of them as threads, one as a rank process):
// LibTorch's own footprint, then per parameter element the model, its gradients, optimizer
// state, snapshots and the float64 oracle's copies, and per rank one micro-batch's
// activations. Calibrated against measured peaks (docs/design.md §12). `elements` replaces
// parameter_elements where the built model is known (harness::model_parameter_elements).
[[nodiscard]] double estimate_memory_bytes(const Scenario& scenario, int ranks_in_process,
                                           std::optional<double> elements = std::nullopt);

// One line that reads as the scenario: used by rapidcheck and by reports.
[[nodiscard]] std::string describe(const Scenario& scenario);
// The model as a scenario file names it: "causal_lm", "torchscript:PATH",
// "python:FILE.py:FUNCTION".
[[nodiscard]] std::string model_name(const Scenario& scenario);
// Prints describe() and then scenario_table(): GoogleTest and rapidcheck show a
// counter-example as a scenario, and as the [[scenario]] table that replays it.
std::ostream& operator<<(std::ostream& out, const Scenario& scenario);

[[nodiscard]] std::string_view to_string(DType value);
[[nodiscard]] std::string_view to_string(ModelKind value);
[[nodiscard]] std::string_view to_string(LossKind value);
[[nodiscard]] std::string_view to_string(OptimizerKind value);
[[nodiscard]] std::string_view to_string(MaskPattern value);
[[nodiscard]] std::string_view to_string(RankAverage value);
[[nodiscard]] std::string_view to_string(FirstLabel value);

// Parse the names printed by to_string; throw InvalidInput listing the accepted names.
[[nodiscard]] DType parse_dtype(std::string_view text);
[[nodiscard]] ModelKind parse_model_kind(std::string_view text);
[[nodiscard]] LossKind parse_loss_kind(std::string_view text);
[[nodiscard]] OptimizerKind parse_optimizer_kind(std::string_view text);
[[nodiscard]] MaskPattern parse_mask_pattern(std::string_view text);
[[nodiscard]] RankAverage parse_rank_average(std::string_view text);
[[nodiscard]] FirstLabel parse_first_label(std::string_view text);

}  // namespace gradnorm::scenarios
