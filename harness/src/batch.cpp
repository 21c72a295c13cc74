#include "gradnorm/harness/batch.hpp"
#include "recent_cache.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>

namespace gradnorm::harness {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Positions [0, T-1) of one sequence that hold a valid label, for `count` valid labels.
std::vector<long> valid_positions(scenarios::MaskPattern mask, int count, int usable,
                                  at::Generator& generator) {
  std::vector<long> positions;
  switch (mask) {
    case scenarios::MaskPattern::trailing_padding:
      for (int i = 0; i < count; ++i) positions.push_back(i);
      break;
    case scenarios::MaskPattern::prompt_prefix: {
      // A masked prompt of half the spare room, then the response, then padding.
      const int prompt = (usable - count) / 2;
      for (int i = 0; i < count; ++i) positions.push_back(prompt + i);
      break;
    }
    case scenarios::MaskPattern::random_holes: {
      const at::Tensor order = at::randperm(usable, generator, at::TensorOptions().dtype(at::kLong));
      const auto* data = order.data_ptr<long>();
      positions.assign(data, data + count);
      std::sort(positions.begin(), positions.end());
      break;
    }
  }
  return positions;
}

}  // namespace

std::uint64_t derive_seed(std::uint64_t base, std::initializer_list<std::uint64_t> path) {
  // Each index is mixed through its own constant and added, so no (base, index) pair can
  // cancel structurally the way base ^ index would when index + 1 == base.
  constexpr std::uint64_t kPathSalt = 0x632be59bd9b4e019ULL;
  std::uint64_t state = splitmix64(base);
  std::uint64_t position = 0;
  for (std::uint64_t index : path) {
    state = splitmix64(state + splitmix64(index ^ (kPathSalt * ++position)));
  }
  return state;
}

namespace {

// Recent micro-batches, by everything that decides them: every variant of a scenario, and
// its oracle, reads the same batches, so each is drawn once. The cache's own tensors are
// never handed out: a step may write into its batch. A few scenarios' windows.
RecentCache<MicroBatch, 256>& batch_cache() {
  static RecentCache<MicroBatch, 256> cache;
  return cache;
}

MicroBatch copy_of(const MicroBatch& b) {
  return MicroBatch{b.inputs.clone(), b.labels.clone(), b.valid_count,
                    b.first_labels.defined() ? b.first_labels.clone() : at::Tensor()};
}

MicroBatch draw_micro_batch(const scenarios::Scenario& s, int rank, int step, int micro);

}  // namespace

MicroBatch make_micro_batch(const scenarios::Scenario& s, int rank, int step, int micro) {
  const std::string key = fmt::format(
      "{} {} {} {} {} {} {} {} {} {} {} {} {} {}", s.seed, static_cast<int>(s.model),
      static_cast<int>(s.dtype), s.micro_batch_size, s.sequence_length, s.vocab_size,
      s.hidden_size, static_cast<int>(s.mask), static_cast<int>(s.first_label), s.accumulation_steps,
      s.valid_tokens.at(rank).at(micro), rank, step, micro);
  if (std::optional<MicroBatch> cached = batch_cache().find(key)) return copy_of(*cached);
  MicroBatch out = draw_micro_batch(s, rank, step, micro);
  batch_cache().store(key, copy_of(out));
  return out;
}

namespace {

MicroBatch draw_micro_batch(const scenarios::Scenario& s, int rank, int step, int micro) {
  at::Generator generator = at::detail::createCPUGenerator(
      derive_seed(s.seed, {static_cast<std::uint64_t>(rank), static_cast<std::uint64_t>(step),
                           static_cast<std::uint64_t>(micro)}));
  const int batch = s.micro_batch_size;
  const int length = s.sequence_length;
  const int count = s.valid_tokens.at(rank).at(micro);

  MicroBatch out;
  if (s.model == scenarios::ModelKind::token_probe) {
    // A unique row per (rank, micro-batch, sequence, position) of the step.
    const long first = ((static_cast<long>(rank) * s.accumulation_steps + micro) * batch) * length;
    out.inputs = at::arange(first, first + static_cast<long>(batch) * length,
                            at::TensorOptions().dtype(at::kLong))
                     .view({batch, length});
  } else if (s.model == scenarios::ModelKind::linear_head) {
    // Drawn in float64 and rounded once, so the oracle's float64 copy is exact.
    out.inputs = at::randn({batch, length, s.hidden_size}, generator, at::kDouble)
                     .to(scalar_type(s.dtype));
  } else {
    out.inputs = at::randint(s.vocab_size, {batch, length}, generator, at::TensorOptions().dtype(at::kLong));
  }
  const at::Tensor targets = at::randint(s.vocab_size, {batch, length}, generator, at::TensorOptions().dtype(at::kLong));
  out.labels = at::full({batch, length}, kIgnoreIndex, at::kLong);
  auto labels = out.labels.accessor<long, 2>();
  auto drawn = targets.accessor<long, 2>();
  const int usable = length - 1;  // the shifted-label convention ignores the last position
  for (int b = 0; b < batch; ++b) {
    const int share = count / batch + (b < count % batch ? 1 : 0);
    for (long position : valid_positions(s.mask, share, usable, generator)) {
      labels[b][position] = drawn[b][position];
    }
  }
  out.valid_count = count;
  TORCH_INTERNAL_ASSERT(out.labels.ne(kIgnoreIndex).sum().item<long>() == count,
                        "harness bug: micro-batch holds the wrong number of valid labels");
  // Drawn last, and only when valid, so every other draw (and every masked scenario's
  // batches) is what it was before the field existed.
  out.first_labels = s.first_label == scenarios::FirstLabel::valid
                         ? at::randint(s.vocab_size, {batch}, generator, at::TensorOptions().dtype(at::kLong))
                         : at::full({batch}, kIgnoreIndex, at::kLong);
  return out;
}

}  // namespace

MicroBatch make_mesh_micro_batch(const scenarios::Scenario& s, int rank, int step, int micro) {
  if (!s.has_mesh()) return make_micro_batch(s, rank, step, micro);
  const scenarios::MeshCoordinates where = s.mesh_coordinates(rank);
  MicroBatch out = make_micro_batch(s, where.data_parallel_rank, step, micro);
  if (s.cp > 1) {
    // Context parallelism: this rank computes the loss of its shard of every sequence; the
    // forward still sees the whole prefix, as ring attention does. The shard is torch's
    // load-balanced one for causal attention: the sequence cut in 2 cp chunks, rank i taking
    // chunks i and 2 cp - 1 - i.
    const auto chunks = at::arange(s.sequence_length, at::TensorOptions().dtype(at::kLong))
                            .tensor_split(2 * s.cp);
    at::Tensor keep = at::zeros({s.sequence_length}, at::TensorOptions().dtype(at::kBool));
    keep.index_fill_(0, chunks[static_cast<std::size_t>(where.cp)], true);
    keep.index_fill_(0, chunks[static_cast<std::size_t>(2 * s.cp - 1 - where.cp)], true);
    out.labels = at::where(keep.unsqueeze(0), out.labels, at::full_like(out.labels, kIgnoreIndex));
    out.valid_count = out.labels.ne(kIgnoreIndex).sum().item<long>();
    // Position 0 lies in chunk 0, cp rank 0's.
    if (where.cp != 0) out.first_labels.fill_(kIgnoreIndex);
  }
  return out;
}

BatchSource scenario_batches(const scenarios::Scenario& scenario) {
  return [scenario](int rank, int step, int micro) {
    return make_mesh_micro_batch(scenario, rank, step, micro);
  };
}

std::vector<MicroBatch> make_rank_window(const scenarios::Scenario& s, int rank, int step) {
  std::vector<MicroBatch> window;
  for (int micro = 0; micro < s.accumulation_steps; ++micro) {
    window.push_back(make_micro_batch(s, rank, step, micro));
  }
  return window;
}

}  // namespace gradnorm::harness
