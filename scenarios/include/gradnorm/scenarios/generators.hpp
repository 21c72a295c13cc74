#pragma once
// rapidcheck generators of valid single-device scenarios, for property tests and fuzzing.
// Header-only so the scenarios library itself does not depend on rapidcheck.

#include <rapidcheck.h>

#include <string>

#include "gradnorm/scenarios/scenario.hpp"

namespace gradnorm::scenarios {

struct GeneratorOptions {
  int max_accumulation = 4;
  int max_micro_batch_size = 3;
  int max_sequence_length = 10;
  bool allow_bfloat16 = true;
  int min_count = 0;  // fewest valid tokens per micro-batch (1 keeps N > 0)
};

// A valid single-device scenario: random counts (zero allowed), window, mask, model, loss,
// optimizer, dtype, clipping and seed. Every generated value passes validate().
inline rc::Gen<Scenario> single_device_scenarios(GeneratorOptions o = {}) {
  return rc::gen::exec([o] {
    Scenario s;
    s.name = "generated";
    s.world_size = 1;
    s.accumulation_steps = *rc::gen::inRange(1, o.max_accumulation + 1);
    s.micro_batch_size = *rc::gen::inRange(1, o.max_micro_batch_size + 1);
    s.sequence_length = *rc::gen::inRange(2, o.max_sequence_length + 1);
    const int capacity = s.micro_batch_capacity();
    std::vector<int> counts;
    for (int micro = 0; micro < s.accumulation_steps; ++micro) {
      counts.push_back(*rc::gen::inRange(std::min(o.min_count, capacity), capacity + 1));
    }
    s.valid_tokens = {counts};
    s.mask = *rc::gen::element(MaskPattern::trailing_padding, MaskPattern::prompt_prefix,
                               MaskPattern::random_holes);
    s.model = *rc::gen::element(ModelKind::causal_lm, ModelKind::linear_head, ModelKind::lora);
    s.loss = *rc::gen::element(LossKind::mean_ce, LossKind::chunked_ce, LossKind::linear_ce);
    s.loss_chunks = *rc::gen::inRange(1, s.sequence_length + 1);
    s.optimizer = *rc::gen::element(OptimizerKind::sgd, OptimizerKind::sgd_momentum);
    s.dtype = o.allow_bfloat16
                  ? *rc::gen::element(DType::float64, DType::float32, DType::bfloat16)
                  : *rc::gen::element(DType::float64, DType::float32);
    if (*rc::gen::arbitrary<bool>()) s.clip_max_norm = *rc::gen::element(0.01, 1.0, 100.0);
    s.steps = *rc::gen::inRange(1, 3);
    s.seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 20);
    return s;
  });
}

// Ragged ranks: world size 2 to 4, accumulation 1, every rank holding at least one token,
// float64 throughout (so per-token weights can be compared to 1e-7).
inline rc::Gen<Scenario> ragged_rank_scenarios() {
  return rc::gen::exec([] {
    Scenario s;
    s.name = "generated-ranks";
    s.world_size = *rc::gen::inRange(2, 5);
    s.accumulation_steps = 1;
    s.micro_batch_size = *rc::gen::inRange(1, 3);
    s.sequence_length = *rc::gen::inRange(2, 8);
    s.dtype = DType::float64;
    s.valid_tokens.clear();
    for (int rank = 0; rank < s.world_size; ++rank) {
      s.valid_tokens.push_back({*rc::gen::inRange(1, s.micro_batch_capacity() + 1)});
    }
    s.seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 20);
    return s;
  });
}

}  // namespace gradnorm::scenarios
