#include "gradnorm/scenarios/catalogue.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fnmatch.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace gradnorm::scenarios {
namespace {

constexpr DType kDTypes[] = {DType::float64, DType::float32, DType::bfloat16};

// A learning rate large enough that one SGD step moves trained parameters by several units
// in the last place, even in bfloat16, so "the optimizer did not step" is visible. Where
// clipping shrinks the update below bfloat16's resolution the verdict says the update check
// was not made.
constexpr double kLearningRate = 0.5;

Scenario single(std::string name, std::vector<int> counts_per_micro_batch) {
  Scenario s;
  s.name = std::move(name);
  s.world_size = 1;
  s.accumulation_steps = static_cast<int>(counts_per_micro_batch.size());
  s.valid_tokens = {std::move(counts_per_micro_batch)};
  s.learning_rate = kLearningRate;
  return s;
}

// Adds `base` once per dtype, named `<base name>/<dtype>`, with a seed unique to the entry.
void add_each_dtype(std::vector<Scenario>& out, const Scenario& base) {
  for (DType dtype : kDTypes) {
    Scenario s = base;
    s.dtype = dtype;
    s.name = fmt::format("{}/{}", base.name, to_string(dtype));
    s.seed = 1000 + out.size();
    out.push_back(std::move(s));
  }
}

Scenario distributed(std::string name, std::vector<std::vector<int>> counts) {
  Scenario s;
  s.name = std::move(name);
  s.world_size = static_cast<int>(counts.size());
  s.accumulation_steps = static_cast<int>(counts.front().size());
  s.valid_tokens = std::move(counts);
  s.learning_rate = kLearningRate;
  return s;
}

// The checks a finding fails (ExpectedVerdict::checks): wrong gradients (whose update and
// clipped norm follow), or the logged loss alone.
const std::vector<std::string> kGradients{"gradients"};
const std::vector<std::string> kLoggedLoss{"logged-loss"};

void document(Scenario& s, std::initializer_list<const char*> patterns, const std::string& verdict,
              const std::string& reason, const std::vector<std::string>& checks = {}) {
  for (const char* pattern : patterns) s.expected_verdicts.push_back({pattern, verdict, reason, checks});
}

constexpr const char* kRaggedSkip =
    "ranks hold different token counts: the skip path weighs a token on rank r by "
    "1/(W n_r) instead of 1/N, and logs the mean of the ranks' means, which is the token mean "
    "only when ranks are balanced";
constexpr const char* kWorldSizeOnly =
    "scaling the skip path's gradients by W weighs a token by 1/n_r instead of 1/N: wrong by "
    "N/n_r even when ranks are balanced";
constexpr const char* kWorldSizeOnlyRagged =
    "scaling the skip path's gradients by W weighs a token by 1/n_r instead of 1/N (wrong by "
    "N/n_r even when ranks are balanced), and on ragged ranks it logs the mean of the ranks' "
    "means, not the token mean";
const std::vector<std::string> kGradientsAndLoss{"gradients", "logged-loss"};

// The seed's verdicts on ragged ranks, measured: skip and world-size-only fail.
Scenario ragged(Scenario s) {
  document(s, {"*skip"}, "fail", kRaggedSkip, kGradientsAndLoss);
  document(s, {"world-size-only"}, "fail", kWorldSizeOnlyRagged, kGradientsAndLoss);
  return s;
}

// Multi-rank steps: every rank holds a replica, gradients are averaged over ranks.
void add_distributed(std::vector<Scenario>& out) {
  // The seed's three cases: mildly ragged, extremely ragged, balanced.
  add_each_dtype(out, ragged(distributed("dist/5-3", {{5}, {3}})));
  {
    Scenario extreme = ragged(distributed("dist/1-64", {{1}, {64}}));
    extreme.micro_batch_size = 4;
    extreme.sequence_length = 17;  // 4 x 16 positions hold 64 valid labels
    add_each_dtype(out, extreme);
  }
  {
    Scenario balanced = distributed("dist/4-4", {{4}, {4}});
    document(balanced, {"world-size-only"}, "fail", kWorldSizeOnly, kGradients);
    add_each_dtype(out, balanced);
  }
  // A fully masked rank beside a full one, and three empty ranks beside one: the empty
  // rank's mean is 0/0, and NaN * 0 reaches every rank's logged loss through the all-reduce.
  for (auto [name, counts] : {std::pair<const char*, std::vector<std::vector<int>>>{
                                  "dist/0-8", {{0}, {8}}},
                              {"dist/8-0-0-0", {{8}, {0}, {0}, {0}}}}) {
    Scenario empty_rank = distributed(name, counts);
    document(empty_rank,
             {"*baseline", "global-prenorm", "qat-lora-distributed", "optimizer-in-backward"},
             "fail",
             "an empty rank's mean is 0/0 = NaN and NaN * 0 reaches every rank's logged loss "
             "through the all-reduce; the gradients are right",
             kLoggedLoss);
    document(empty_rank, {"*skip"}, "fail",
             "the empty rank's NaN reaches the logged loss, and the gradients are wrong too: the "
             "full rank's tokens weigh 1/(W n_r), not 1/N",
             {"gradients", "logged-loss"});
    document(empty_rank, {"world-size-only"}, "fail",
             "the empty rank's NaN reaches the logged loss; the gradients are right, because "
             "the one rank with tokens holds all N of them and W x 1/(W N) = 1/N",
             kLoggedLoss);
    add_each_dtype(out, empty_rank);
  }
  // Accumulation 2 on ragged ranks: the skip gate is closed.
  add_each_dtype(out, distributed("dist/accum2-ragged", {{5, 3}, {1, 6}}));
  // The average's placement and clipping, on the mild case.
  {
    Scenario before = ragged(distributed("dist/5-3-divide-before-sum", {{5}, {3}}));
    before.rank_average = RankAverage::divide_before_sum;
    add_each_dtype(out, before);
    Scenario clipped = ragged(distributed("dist/5-3-clip-active", {{5}, {3}}));
    clipped.clip_max_norm = 0.01;
    add_each_dtype(out, clipped);
  }
  // Eight ragged ranks, and sixty-four (threads make these cheap).
  add_each_dtype(out, ragged(distributed("dist/8-ranks-ragged",
                                         {{3}, {9}, {1}, {6}, {12}, {2}, {7}, {4}})));
  for (int ranks : {32, 64}) {
    std::vector<std::vector<int>> counts;
    for (int rank = 0; rank < ranks; ++rank) counts.push_back({1 + (rank * 5) % 13});
    Scenario many = ragged(distributed(fmt::format("dist/{}-ranks-ragged", ranks), counts));
    many.dtype = DType::float32;
    many.seed = 1000 + out.size();
    many.name += "/float32";
    out.push_back(many);
  }
}


// Meshes (docs/design.md §7): tensor parallelism (ranks that share their batch), context
// parallelism (ranks that split each sequence), HSDP (replicated shard groups), with and
// without optimizer in backward. Measured, then documented.
constexpr const char* kCandidatesOnMeshes =
    "the pull request's skip path (and the review's world_size-only reading) weigh a token by "
    "its rank's own count and log the mean of the ranks' means: wrong on ragged data-parallel "
    "ranks, whatever the mesh adds";
constexpr const char* kDpDegree =
    "optimizer in backward multiplies the loss by dp_degree / num_tokens "
    "(full_finetune_distributed.py:1023, qat_distributed.py:996), but num_tokens is all-reduced "
    "over the whole world (tensor-parallel replicas count their batch again, context-parallel "
    "shards add up) and FSDP averages over dp x cp ranks: every token weighs 1/(tp cp N), so "
    "the gradients are 1/(tp cp) of the contract's (relative error 0.5 with tp or cp = 2); the "
    "token-sum path's world_size / num_tokens has no such factor";

void add_meshes(std::vector<Scenario>& out) {
  auto mesh = [](std::string name, std::vector<std::vector<int>> counts, int tp, int cp,
                 int replicate) {
    Scenario s = distributed(std::move(name), std::move(counts));
    s.tp = tp;
    s.cp = cp;
    s.dp_replicate = replicate;
    s.world_size = static_cast<int>(s.valid_tokens.size()) * tp * cp;
    return s;
  };
  const auto candidates = {"skip", "world-size-only", "lora-skip", "qat-skip"};
  Scenario tp2 = mesh("dist/tp2", {{5}, {3}}, 2, 1, 1);
  document(tp2, candidates, "fail", kCandidatesOnMeshes, kGradientsAndLoss);
  document(tp2, {"optimizer-in-backward"}, "fail", kDpDegree, kGradients);
  add_each_dtype(out, tp2);

  // Every context-parallel shard holds labels here (random holes over 15 positions).
  Scenario cp2 = mesh("dist/cp2", {{12}, {10}}, 1, 2, 1);
  cp2.micro_batch_size = 1;
  cp2.sequence_length = 16;
  cp2.mask = MaskPattern::random_holes;
  document(cp2, candidates, "fail", kCandidatesOnMeshes, kGradientsAndLoss);
  document(cp2, {"optimizer-in-backward"}, "fail", kDpDegree, kGradients);
  add_each_dtype(out, cp2);

  // Short responses with trailing padding: on the second data-parallel rank every label
  // sits in the first chunk of its sequence, so the other context-parallel rank holds none.
  Scenario padded = mesh("dist/cp2-padded", {{5}, {3}}, 1, 2, 1);
  constexpr const char* kPaddingShard =
      "a context-parallel rank whose shard is all padding has a token mean of 0/0 = NaN; "
      "running_loss += NaN * 0 and the all-reduce carry it into every rank's logged loss";
  document(padded, {"*baseline", "global-prenorm", "qat-lora-distributed"}, "fail",
           fmt::format("{}; the gradients are right", kPaddingShard), kLoggedLoss);
  document(padded, {"early-exit-distributed"}, "fail",
           fmt::format("{}; and the recipe's 1 / num_tokens after FSDP's 1/W average leaves the "
                       "gradients 1/W of the contract's",
                       kPaddingShard),
           kGradientsAndLoss);
  document(padded, candidates, "fail",
           fmt::format("{}; {}", kCandidatesOnMeshes, kPaddingShard), kGradientsAndLoss);
  document(padded, {"optimizer-in-backward"}, "fail", fmt::format("{}; {}", kDpDegree, kPaddingShard),
           kGradientsAndLoss);
  add_each_dtype(out, padded);

  Scenario hsdp = mesh("dist/hsdp", {{5}, {3}, {4}, {2}}, 1, 1, 2);
  document(hsdp, candidates, "fail", kCandidatesOnMeshes, kGradientsAndLoss);
  add_each_dtype(out, hsdp);

  for (auto [name, tp, cp] : {std::tuple{"dist/tp2-in-bwd", 2, 1}, std::tuple{"dist/cp2-in-bwd", 1, 2}}) {
    Scenario in_bwd = mesh(name, {{12}, {10}}, tp, cp, 1);
    in_bwd.micro_batch_size = 1;
    in_bwd.sequence_length = 16;
    in_bwd.mask = MaskPattern::random_holes;
    in_bwd.optimizer_in_backward = true;
    document(in_bwd, {"baseline", "skip", "world-size-only", "optimizer-in-backward", "qat-baseline",
                      "qat-skip"},
             "fail", kDpDegree, kGradients);
    add_each_dtype(out, in_bwd);
  }
}

std::vector<Scenario> build_catalogue() {
  std::vector<Scenario> out;
  // The seed's check 1: single-device gradients for n in {1, 3, 5, 8}.
  for (int n : {1, 3, 5, 8}) add_each_dtype(out, single(fmt::format("single/n{}", n), {n}));

  // The seed's check 2: an all-masked step, once per loss kind (they differ, docs/design.md §1).
  for (LossKind loss : {LossKind::mean_ce, LossKind::chunked_ce, LossKind::linear_ce}) {
    Scenario s = single(fmt::format("single/all-masked-{}", to_string(loss)), {0});
    s.loss = loss;
    if (loss != LossKind::linear_ce) {
      // Measured, not assumed: the seed claimed both paths raise the same error. That holds
      // only for a loss that returns a graph-less zero (linear_ce).
      for (const char* pattern : {"*skip", "world-size-only", "global-prenorm"}) {
        s.expected_verdicts.push_back(
            {pattern, "error-mismatch",
             "the loss's backward writes zero gradients for ignored tokens; the baseline then "
             "scales them by 1/0 and steps on NaN, this variant has no such pass and steps on "
             "finite zeros",
             {}});
      }
    }
    add_each_dtype(out, s);
  }

  // A window with tokens whose first micro-batch is all-masked (found by the property
  // tests): the recipe's own loss and logging, not its gradients, go wrong there.
  for (LossKind loss : {LossKind::mean_ce, LossKind::chunked_ce, LossKind::linear_ce}) {
    Scenario s = single(fmt::format("single/accum2-empty-first-{}", to_string(loss)), {0, 5});
    s.loss = loss;
    const bool raises = loss == LossKind::linear_ce;
    const std::string verdict = raises ? "error-mismatch" : "fail";
    const std::string reason =
        raises ? "the empty micro-batch's loss is a graph-less zero, so backward raises although "
                 "the window has tokens"
               : "the empty micro-batch's mean is 0/0 = NaN and NaN * 0 = NaN enters "
                 "running_loss: the logged loss is NaN while the gradients are right";
    for (const char* pattern : {"*baseline", "*skip", "world-size-only", "global-prenorm",
                                "qat-lora-distributed", "early-exit-distributed"}) {
      s.expected_verdicts.push_back({pattern, verdict, reason, raises ? std::vector<std::string>{} : kLoggedLoss});
    }
    add_each_dtype(out, s);
  }

  // The seed's check 6: accumulation over ragged micro-batches.
  add_each_dtype(out, single("single/accum2-ragged", {5, 3}));
  add_each_dtype(out, single("single/accum4-ragged", {1, 7, 2, 6}));

  // The seed's check 8: clipping active (max-norm far below the gradient norm) and inactive.
  {
    Scenario active = single("single/clip-active", {5});
    active.clip_max_norm = 0.01;
    add_each_dtype(out, active);
    Scenario inactive = single("single/clip-inactive", {5});
    inactive.clip_max_norm = 1000.0;
    add_each_dtype(out, inactive);
    Scenario accum = single("single/accum2-clip-active", {5, 3});
    accum.clip_max_norm = 0.01;
    add_each_dtype(out, accum);
  }

  // Loss kinds, models, masks and optimizers on a ragged window.
  {
    Scenario chunked = single("single/accum2-chunked", {5, 3});
    chunked.loss = LossKind::chunked_ce;
    add_each_dtype(out, chunked);
    Scenario linear = single("single/n5-linear-ce", {5});
    linear.loss = LossKind::linear_ce;
    add_each_dtype(out, linear);
    Scenario head = single("single/n5-linear-head", {5});
    head.model = ModelKind::linear_head;
    add_each_dtype(out, head);
    Scenario lora = single("single/n5-lora", {5});
    lora.model = ModelKind::lora;
    add_each_dtype(out, lora);
    Scenario prompt = single("single/accum2-prompt-prefix", {4, 2});
    prompt.mask = MaskPattern::prompt_prefix;
    add_each_dtype(out, prompt);
    Scenario holes = single("single/n6-random-holes", {6});
    holes.mask = MaskPattern::random_holes;
    add_each_dtype(out, holes);
    Scenario momentum = single("single/n5-momentum-3steps", {5});
    momentum.optimizer = OptimizerKind::sgd_momentum;
    momentum.steps = 3;
    add_each_dtype(out, momentum);
    Scenario adamw = single("single/n5-adamw", {5});
    adamw.optimizer = OptimizerKind::adamw;
    adamw.learning_rate = 0.01;
    adamw.weight_decay = 0.01;
    add_each_dtype(out, adamw);
  }

  // Optimizer in backward, and the two configurations the recipe refuses with it.
  {
    Scenario in_bwd = single("single/in-bwd-n5", {5});
    in_bwd.optimizer_in_backward = true;
    add_each_dtype(out, in_bwd);
    Scenario with_clip = in_bwd;
    with_clip.name = "single/in-bwd-clip-refused";
    with_clip.clip_max_norm = 1.0;
    add_each_dtype(out, with_clip);
    Scenario with_accum = single("single/in-bwd-accum2-refused", {5, 3});
    with_accum.optimizer_in_backward = true;
    add_each_dtype(out, with_accum);
  }
  add_distributed(out);
  // Entries are seeded by position (1000 + index): a new entry goes last, so no earlier
  // entry's batches or parameters change.
  {
    // clip_grad_norm: 0. clip_grad_norm_ zeroes the gradients (the contract: coef 0, no
    // update); full_finetune_single_device's `if self._clip_grad_norm:` skips it instead.
    Scenario zero = single("single/clip-zero", {5});
    zero.clip_max_norm = 0.0;
    document(zero, {"baseline", "skip", "world-size-only", "global-prenorm"}, "fail",
             "full_finetune_single_device.py:628 gates clipping with `if self._clip_grad_norm:`, "
             "so a max-norm of 0 skips clip_grad_norm_ (which would zero the gradients, as the "
             "recipe's own optimizer-in-backward check at :153 and every other recipe's `is not "
             "None` treat it): the step applies the whole unclipped gradient, and no norm is "
             "logged",
             {"gradients", "grad-norm"});
    add_each_dtype(out, zero);
  }
  add_meshes(out);
  // Where the first label sits: training on the input leaves position 0's label valid. The
  // shift drops it, so a count taken before the shift sees a token the loss never does
  // (docs/design.md §14). Each first-valid/X is X with its first labels valid and nothing
  // else changed: its seed too, and the first labels are drawn after every other draw
  // (harness/src/batch.cpp), so the tokens, the shifted labels and the parameters are X's.
  // A step given only the shifted labels sees X's numbers exactly; one given labels aligned
  // with the tokens (a real recipe, a Python step) can tell the two apart.
  for (const char* twin : {"single/n5", "single/accum2-ragged", "single/accum4-ragged", "dist/5-3",
                           "dist/4-4", "dist/accum2-ragged"}) {
    for (DType dtype : kDTypes) {
      const std::string name = fmt::format("{}/{}", twin, to_string(dtype));
      const auto masked = std::find_if(out.begin(), out.end(),
                                       [&](const Scenario& s) { return s.name == name; });
      if (masked == out.end()) throw std::logic_error("catalogue: no scenario " + name);
      Scenario valid = *masked;
      valid.name = "first-valid/" + name;
      valid.first_label = FirstLabel::valid;
      out.push_back(std::move(valid));
    }
  }
  for (const Scenario& s : out) validate(s);
  return out;
}

}  // namespace

const std::vector<Scenario>& catalogue() {
  static const std::vector<Scenario> scenarios = build_catalogue();
  return scenarios;
}

const Scenario& find_scenario(std::string_view name) { return find_scenario(catalogue(), name); }

std::vector<Scenario> select_scenarios(std::string_view pattern) {
  return select_scenarios(catalogue(), pattern);
}

const Scenario& find_scenario(const std::vector<Scenario>& pool, std::string_view name) {
  std::vector<std::string_view> near;
  for (const Scenario& s : pool) {
    if (s.name == name) return s;
    const auto slash = name.find('/');
    if (s.name.compare(0, slash == std::string_view::npos ? name.size() : slash,
                       name.substr(0, slash)) == 0) {
      near.push_back(s.name);
    }
  }
  if (near.size() > 12) near.resize(12);
  throw InvalidInput(fmt::format("unknown scenario '{}'{}", name,
                                 near.empty() ? std::string(": see `gradnorm list`")
                                              : fmt::format("; did you mean one of: {}",
                                                            fmt::join(near, ", "))));
}

std::vector<Scenario> select_scenarios(const std::vector<Scenario>& pool, std::string_view pattern) {
  const std::string text(pattern);
  std::vector<Scenario> out;
  for (const Scenario& s : pool) {
    if (s.name == text || fnmatch(text.c_str(), s.name.c_str(), 0) == 0) out.push_back(s);
  }
  if (out.empty()) {
    (void)find_scenario(pool, pattern);  // throws with suggestions
  }
  return out;
}

}  // namespace gradnorm::scenarios
