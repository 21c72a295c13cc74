#!/usr/bin/env bash
# ctest: a user's own loop on DeepSpeed's engine (the environment's deepspeed 0.19.8, built from
# its source distribution without ops by scripts/install-deps.sh), unmodified:
# examples/deepspeed/mean_loss.py (the getting-started loop, each micro-batch's mean) and
# token_loss.py (normalised by the window's token count over the ranks), at ZeRO 0, 1 and 2 on 2
# rank processes over Gloo and on one (--nproc 1), and a negative control for each duty of the
# adapter (tests/python/deepspeed/loops.py). The figures are the ones measured and explained in
# docs/findings.md ("DeepSpeed"). Skips (77) where deepspeed is not installed.
# Arguments: GRADNORM_BINARY SOURCE_DIR WORK_DIR
set -uo pipefail
framework=deepspeed
source "$(dirname "${BASH_SOURCE[0]}")/loop_common.sh"
t=tiny_transformer

# The mean loop: a mean of micro-batch means, whatever the stage (ZeRO 0 and 2 on 2 ranks).
# ZeRO 0 here, with exec'd rank processes (the default).
expect_mean() {  # OUTPUT VARIANT
  row $t/dist/5-3/float32 "$2" fail "$1"
  reason $t/dist/5-3/float32 "$2" "every rank: step 0: gradients rel L2 error 0.244 > 1e-05" "$1"
  row $t/dist/0-8/float32 "$2" fail "$1"
  reason $t/dist/0-8/float32 "$2" "every rank: step 0: gradients rel L2 error 0.5 > 1e-05" "$1"
  # Right gradients; the loop logs rank 0's window mean only.
  row $t/dist/4-4/float32 "$2" fail "$1"
  reason $t/dist/4-4/float32 "$2" "every rank: step 0: logged loss 2.43944097, oracle 2.41161241" "$1"
}
"$gradnorm" run --recipe "$mean" --nproc 2 --recipe-arg zero_optimization.stage=0 \
  -s dist/5-3/float32 -s dist/0-8/float32 -s dist/4-4/float32 > mean-0.txt 2>&1
expect_mean mean-0.txt deepspeed/mean_loss.train
expect "deepspeed/mean_loss.train is $source_dir/examples/deepspeed/mean_loss.py:train (deepspeed 0.19.8's engine, ZeRO 0), unmodified" mean-0.txt

# The rank processes from here on are forked warm from the supervisor (docs/ranks.md, "Warm
# rank processes"), as fuzz --nproc forks them. Runs share what costs little: at ZeRO 0 an
# engine is made for each pair in about 0.15 s, at ZeRO 1 and 2 in about 2 s, so the variants
# at ZeRO 1 and 2 run only on the scenarios that show what they are for.
export GRADNORM_WARM_RANKS=1
tokens_pass() {  # OUTPUT VARIANT: the token loop is exact, clipping and 3 steps with momentum included
  for s in dist/5-3/float32 dist/0-8/float32 dist/4-4/float32 dist/5-3-clip-active/float32; do
    row $t/$s "$2" pass "$1"
  done
  row lightning/dist-accum2-momentum-3steps-clip "$2" pass "$1"
}
# ZeRO 0: the token loop, and the negative controls (feeds, clips, resets) on every scenario.
{
  variant ds/feeds-reversed "deepspeed:$tests:feeds_reversed"
  variant ds/skips-clipping "deepspeed:$tests:engine_skips_clipping"
  variant ds/forgets-zero-grad "deepspeed:$tests:engine_forgets_zero_grad"
} > zero0.toml
"$gradnorm" run --recipe "$tokens" --nproc 2 --recipe-arg zero_optimization.stage=0 -f zero0.toml \
  -s dist/5-3/float32 -s dist/0-8/float32 -s dist/4-4/float32 -s dist/5-3-clip-active/float32 \
  -f "$scenarios" -s 'lightning/dist*' > zero0.txt 2>&1
tokens_pass zero0.txt deepspeed/token_loss.train
reason $t/dist/5-3/float32 ds/feeds-reversed \
  "rank 1 step 0: the model was given input_ids that are not this window's micro-batches in order" zero0.txt
row $t/dist/5-3-clip-active/float32 ds/skips-clipping fail zero0.txt
row lightning/dist-accum2-momentum-3steps-clip ds/forgets-zero-grad fail zero0.txt
reason lightning/dist-accum2-momentum-3steps-clip ds/forgets-zero-grad "every rank: step 1: gradients rel L2 error" zero0.txt
# ZeRO 1 and 2: the token loop.
variant ds/tokens-zero2 "$tokens" zero_optimization.stage=2 > zero12.toml
"$gradnorm" run --recipe "$tokens" --nproc 2 --recipe-arg zero_optimization.stage=1 -f zero12.toml \
  -s dist/5-3/float32 -s dist/0-8/float32 -s dist/4-4/float32 -s dist/5-3-clip-active/float32 \
  -f "$scenarios" -s 'lightning/dist*' > zero12.txt 2>&1
tokens_pass zero12.txt deepspeed/token_loss.train
tokens_pass zero12.txt ds/tokens-zero2
# The mean loop at ZeRO 2.
"$gradnorm" run --recipe "$mean" --nproc 2 --recipe-arg zero_optimization.stage=2 \
  -s dist/5-3/float32 -s dist/0-8/float32 -s dist/4-4/float32 > mean-2.txt 2>&1
expect_mean mean-2.txt deepspeed/mean_loss.train
expect "deepspeed/mean_loss.train is $source_dir/examples/deepspeed/mean_loss.py:train (deepspeed 0.19.8's engine, ZeRO 2), unmodified" mean-2.txt
# Negative controls at ZeRO 1 and 2: clips, gathers ZeRO's partitions.
"$gradnorm" run --recipe "deepspeed:$tests:engine_skips_clipping" --nproc 2 \
  --recipe-arg zero_optimization.stage=2 -s dist/5-3-clip-active/float32 > clip-2.txt 2>&1
row $t/dist/5-3-clip-active/float32 deepspeed/loops.engine_skips_clipping fail clip-2.txt
for stage in 1 2; do
  "$gradnorm" run --recipe "deepspeed:$tests:rank1_partition_zeroed" --nproc 2 \
    --recipe-arg zero_optimization.stage=$stage -s dist/5-3/float32 > partition-$stage.txt 2>&1
  row $t/dist/5-3/float32 deepspeed/loops.rank1_partition_zeroed fail partition-$stage.txt
done

# One device (--nproc 1), one run: the mean loop; the partial last window, where the engine
# never steps (it steps where micro_steps + 1 is a multiple of gradient_accumulation_steps), so
# the oracle's step has no counterpart; and the logs' negative control.
{
  variant ds/tokens-accumulates-4 "$tokens" gradient_accumulation_steps=4
  variant ds/logs-elsewhere "deepspeed:$tests:logs_elsewhere"
  variant ds/logs-as-samples-loss "deepspeed:$tests:logs_elsewhere" log_name=Train/Samples/loss
} > one.toml
"$gradnorm" run --recipe "$mean" --nproc 1 -f one.toml -s single/n5/float32 \
  -s single/accum2-ragged/float32 -s single/clip-active/float32 > one.txt 2>&1
row $t/single/n5/float32 deepspeed/mean_loss.train pass one.txt
row $t/single/clip-active/float32 deepspeed/mean_loss.train pass one.txt
row $t/single/accum2-ragged/float32 deepspeed/mean_loss.train fail one.txt
reason $t/single/accum2-ragged/float32 deepspeed/mean_loss.train "step 0: gradients rel L2 error 0.289 > 1e-05" one.txt
row $t/single/accum2-ragged/float32 ds/tokens-accumulates-4 error-mismatch one.txt
reason $t/single/accum2-ragged/float32 ds/tokens-accumulates-4 \
  "DeepSpeed did not step its optimizer in gradnorm step 0: its engine counted 2 micro-steps" one.txt
reason $t/single/n5/float32 ds/logs-elsewhere "step 0: no loss was logged" one.txt
row $t/single/n5/float32 ds/logs-as-samples-loss pass one.txt

# Bad input: exit 2 before anything runs; ranks as threads are refused with the reason.
bad() {  # bad NAME TEXT ARGS...: the run exits 2 and says TEXT
  local name=$1 text=$2
  shift 2
  "$gradnorm" run "$@" > "$name.txt" 2>&1
  echo "$name: exit $?" >> "$name.txt"
  expect "$text" "$name.txt"
  expect "$name: exit 2" "$name.txt"
}
bad stage3 "gradnorm judges ZeRO stages 0, 1 and 2" --recipe "$tokens" --nproc 2 \
  --recipe-arg zero_optimization.stage=3 -s dist/5-3/float32
bad fp16 "fp16 is gradnorm's to set" --recipe "$tokens" --recipe-arg fp16.enabled=true -s dist/5-3/float32
bad unknown "a DeepSpeed loop takes log_name=NAME or a DeepSpeed config key" --recipe "$tokens" \
  --recipe-arg zero_optimisation.stage=2 -s dist/5-3/float32
bad typo "zero_optimization" --recipe "$tokens" --nproc 1 --recipe-arg zero_optimization.stagee=2 \
  -s single/n5/float32
bad offload "offloading steps DeepSpeed's own compiled CPU optimizer" --recipe "$tokens" \
  --recipe-arg zero_optimization.offload_optimizer.device=cpu -s dist/5-3/float32
"$gradnorm" run --recipe "$tokens" -s single/n5/float32 > threads.txt 2>&1
expect "DeepSpeed makes process groups of its own (torch.distributed.new_group), which gradnorm's ranks offer only as processes" threads.txt

exit $failed
