#!/usr/bin/env bash
# ctest: a user's own loop on DeepSpeed's engine (the environment's deepspeed 0.19.8, built from
# its source distribution without ops by scripts/install-deps.sh), unmodified:
# examples/deepspeed/mean_loss.py (the getting-started loop, each micro-batch's mean) and
# token_loss.py (normalised by the window's token count over the ranks), at ZeRO 0, 1 and 2 on 2
# rank processes over Gloo and on one (--nproc 1), and a negative control for each duty of the
# adapter (tests/python/deepspeed/loops.py). The figures are the ones measured and explained in
# docs/findings.md ("DeepSpeed"). Skips (77) where deepspeed cannot be imported.
# Arguments: GRADNORM_BINARY SOURCE_DIR WORK_DIR
set -uo pipefail
framework=deepspeed
source "$(dirname "${BASH_SOURCE[0]}")/loop_common.sh"
t=tiny_transformer

# The mean loop: a mean of micro-batch means, whatever the stage (ZeRO 0 and 2 on 2 ranks).
for stage in 0 2; do
  out=mean-$stage.txt
  "$gradnorm" run --recipe "$mean" --nproc 2 --recipe-arg zero_optimization.stage=$stage \
    -s dist/5-3/float32 -s dist/0-8/float32 -s dist/4-4/float32 > $out 2>&1
  row $t/dist/5-3/float32 deepspeed/mean_loss.train fail $out
  expect "every rank: step 0: gradients rel L2 error 0.244 > 1e-05" $out
  row $t/dist/0-8/float32 deepspeed/mean_loss.train fail $out
  expect "every rank: step 0: gradients rel L2 error 0.5 > 1e-05" $out
  # Right gradients; the loop logs rank 0's window mean only.
  row $t/dist/4-4/float32 deepspeed/mean_loss.train fail $out
  expect "every rank: step 0: logged loss 2.43944097, oracle 2.41161241" $out
  expect "deepspeed/mean_loss.train is $source_dir/examples/deepspeed/mean_loss.py:train (deepspeed 0.19.8's engine, ZeRO $stage), unmodified" $out
  # Rank processes from here on are forked warm from the supervisor (docs/ranks.md, "Warm
  # rank processes"), as fuzz --nproc forks them; ZeRO 0's run exec'd its ranks, the default.
  export GRADNORM_WARM_RANKS=1
done
"$gradnorm" run --recipe "$mean" --nproc 1 -s single/n5/float32 -s single/accum2-ragged/float32 \
  -s single/clip-active/float32 > mean-one.txt 2>&1
row $t/single/n5/float32 deepspeed/mean_loss.train pass mean-one.txt
row $t/single/clip-active/float32 deepspeed/mean_loss.train pass mean-one.txt
row $t/single/accum2-ragged/float32 deepspeed/mean_loss.train fail mean-one.txt
expect "step 0: gradients rel L2 error 0.289 > 1e-05" mean-one.txt

# The token loop is exact at every stage, clipping and 3 steps with momentum included.
for stage in 0 1 2; do
  out=tokens-$stage.txt
  "$gradnorm" run --recipe "$tokens" --nproc 2 --recipe-arg zero_optimization.stage=$stage \
    -s dist/5-3/float32 -s dist/0-8/float32 -s dist/5-3-clip-active/float32 -f "$scenarios" \
    -s 'lightning/dist*' > $out 2>&1
  echo "tokens-$stage: exit $?" >> $out
  for s in dist/5-3/float32 dist/0-8/float32 dist/5-3-clip-active/float32; do
    row $t/$s deepspeed/token_loss.train pass $out
  done
  row lightning/dist-accum2-momentum-3steps-clip deepspeed/token_loss.train pass $out
  expect "tokens-$stage: exit 0" $out
done

# The partial last window: the engine never steps (it steps where micro_steps + 1 is a multiple
# of gradient_accumulation_steps), so the oracle's step has no counterpart.
"$gradnorm" run --recipe "$tokens" --nproc 1 --recipe-arg gradient_accumulation_steps=4 \
  -s single/accum2-ragged/float32 > partial.txt 2>&1
row $t/single/accum2-ragged/float32 deepspeed/token_loss.train error-mismatch partial.txt
expect "DeepSpeed did not step its optimizer in gradnorm step 0: its engine counted 2 micro-steps" partial.txt

# Negative controls: feeds, logs, clips, gathers ZeRO's partitions, resets.
"$gradnorm" run --recipe "deepspeed:$tests:feeds_reversed" --nproc 2 -s dist/5-3/float32 > fed.txt 2>&1
expect "rank 1 step 0: the model was given input_ids that are not this window's micro-batches in order" fed.txt
"$gradnorm" run --recipe "deepspeed:$tests:logs_elsewhere" --nproc 1 -s single/n5/float32 > no-log.txt 2>&1
expect "step 0: no loss was logged" no-log.txt
"$gradnorm" run --recipe "deepspeed:$tests:logs_elsewhere" --recipe-arg log_name=Train/Samples/loss \
  --nproc 1 -s single/n5/float32 > log-name.txt 2>&1
row $t/single/n5/float32 deepspeed/loops.logs_elsewhere pass log-name.txt
for stage in 0 2; do
  "$gradnorm" run --recipe "deepspeed:$tests:engine_skips_clipping" --nproc 2 \
    --recipe-arg zero_optimization.stage=$stage -s dist/5-3-clip-active/float32 > clip-$stage.txt 2>&1
  row $t/dist/5-3-clip-active/float32 deepspeed/loops.engine_skips_clipping fail clip-$stage.txt
done
for stage in 1 2; do
  "$gradnorm" run --recipe "deepspeed:$tests:rank1_partition_zeroed" --nproc 2 \
    --recipe-arg zero_optimization.stage=$stage -s dist/5-3/float32 > partition-$stage.txt 2>&1
  row $t/dist/5-3/float32 deepspeed/loops.rank1_partition_zeroed fail partition-$stage.txt
done
"$gradnorm" run --recipe "deepspeed:$tests:engine_forgets_zero_grad" --nproc 2 -f "$scenarios" \
  -s 'lightning/dist*' > zero-grad.txt 2>&1
row lightning/dist-accum2-momentum-3steps-clip deepspeed/loops.engine_forgets_zero_grad fail zero-grad.txt
expect "every rank: step 1: gradients rel L2 error" zero-grad.txt

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
