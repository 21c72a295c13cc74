#pragma once
// Tensors of one micro-batch, built deterministically from a scenario's seed.

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "gradnorm/harness/dtype.hpp"  // scalar_type, for the batches' users
#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::harness {

inline constexpr long kIgnoreIndex = -100;

struct MicroBatch {
  // causal_lm and lora: token ids [B, T] (int64). linear_head: features [B, T, H] in the
  // scenario's dtype.
  at::Tensor inputs;
  // [B, T] int64, already shifted: position T-1 of every sequence is kIgnoreIndex.
  at::Tensor labels;
  long valid_count = 0;  // labels != kIgnoreIndex, equal to the scenario's count
  // [B] int64: each sequence's label at position 0 before the shift (scenario first_label):
  // kIgnoreIndex when masked, a token id when valid. The shifted labels never hold it; a
  // recipe that receives aligned labels sees [first_labels, labels[:, :T-1]].
  at::Tensor first_labels;
};

// The micro-batch `micro` of data-parallel rank `rank` at optimizer step `step`; the same
// arguments always give bit-identical tensors.
[[nodiscard]] MicroBatch make_micro_batch(const scenarios::Scenario& scenario, int rank, int step,
                                          int micro);

// What world rank `rank` of the scenario's mesh sees: its data-parallel rank's micro-batch,
// with, under context parallelism, only its own shard of every sequence labelled.
[[nodiscard]] MicroBatch make_mesh_micro_batch(const scenarios::Scenario& scenario, int rank,
                                               int step, int micro);

// Where a run takes its micro-batches from: (rank, step, micro) -> tensors. The default is
// make_micro_batch; tests and users can feed their own batches.
using BatchSource = std::function<MicroBatch(int rank, int step, int micro)>;

// The scenario's own batches, by world rank (make_mesh_micro_batch).
[[nodiscard]] BatchSource scenario_batches(const scenarios::Scenario& scenario);

// Every micro-batch of data-parallel rank `rank` for one optimizer step, in order.
[[nodiscard]] std::vector<MicroBatch> make_rank_window(const scenarios::Scenario& scenario,
                                                       int rank, int step);

// A 64-bit seed mixed from the scenario seed and a path of indices (splitmix64), so
// separate streams never overlap.
[[nodiscard]] std::uint64_t derive_seed(std::uint64_t base, std::initializer_list<std::uint64_t> path);

}  // namespace gradnorm::harness
