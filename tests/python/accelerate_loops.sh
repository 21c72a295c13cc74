#!/usr/bin/env bash
# ctest: a user's own loop on Hugging Face Accelerate (the environment's accelerate 1.16.0),
# unmodified: examples/accelerate/mean_loss.py (the accumulate loop of Accelerate's guide, each
# micro-batch's mean) and token_loss.py (its variable-size guide's token-level loop), on one
# device and on 2 rank processes over Gloo DDP, and a negative control for each duty of the
# adapter (tests/python/accelerate/loops.py). The figures are the ones measured and explained in
# docs/findings.md ("Accelerate"). Skips (77) where accelerate is not installed.
# Arguments: GRADNORM_BINARY SOURCE_DIR WORK_DIR
set -uo pipefail
framework=accelerate
source "$(dirname "${BASH_SOURCE[0]}")/loop_common.sh"

# Runs share what costs little (a pair takes a fraction of a second, a start 3 to 5 s): each
# run below is the mean loop (--recipe) and the variants of a scenario file, every one of them
# on every scenario of the run, their rows checked one by one.
t=tiny_transformer/single
# One device: the mean and token loops; the partial last window (gradient_accumulation_steps=4
# on a window of 2 micro-batches); the negative controls (resets, logs, clips).
{
  variant accelerate/token_loss.train "$tokens"
  variant acc/mean-accumulates-4 "$mean" gradient_accumulation_steps=4
  variant acc/tokens-accumulates-4 "$tokens" gradient_accumulation_steps=4
  variant acc/forgets-zero-grad "accelerate:$tests:forgets_zero_grad"
  variant acc/logs-elsewhere "accelerate:$tests:logs_elsewhere"
  variant acc/logs-as-train-loss "accelerate:$tests:logs_elsewhere" log_name=train_loss
  variant acc/never-clips "accelerate:$tests:never_clips"
} > one.toml
"$gradnorm" run --recipe "$mean" -f one.toml -s single/n5/float32 -s single/clip-active/float32 \
  -s single/accum2-ragged/float32 -s single/accum2-empty-first-mean_ce/float32 \
  -s single/accum2-clip-active/float32 -f "$scenarios" -s 'lightning/accum2*' > one.txt 2>&1
row $t/n5/float32 accelerate/mean_loss.train pass one.txt
row $t/clip-active/float32 accelerate/mean_loss.train pass one.txt
row $t/accum2-ragged/float32 accelerate/mean_loss.train fail one.txt
reason $t/accum2-ragged/float32 accelerate/mean_loss.train "step 0: gradients rel L2 error 0.289 > 1e-05" one.txt
row $t/accum2-empty-first-mean_ce/float32 accelerate/mean_loss.train fail one.txt
reason $t/accum2-empty-first-mean_ce/float32 accelerate/mean_loss.train "step 0: gradients rel L2 error 0.5 > 1e-05" one.txt
expect "accelerate/mean_loss.train is $source_dir/examples/accelerate/mean_loss.py:train (accelerate 1.16.0's Accelerator), unmodified" one.txt
for s in accum2-ragged/float32 accum2-clip-active/float32 accum2-empty-first-mean_ce/float32; do
  row $t/$s accelerate/token_loss.train pass one.txt
done
row lightning/accum2-momentum-3steps-clip accelerate/token_loss.train pass one.txt
row $t/accum2-ragged/float32 acc/mean-accumulates-4 fail one.txt
reason $t/accum2-ragged/float32 acc/mean-accumulates-4 "step 0: gradients rel L2 error 0.558 > 1e-05" one.txt
expect "(accelerate 1.16.0's Accelerator(gradient_accumulation_steps=4))" one.txt
row $t/accum2-ragged/float32 acc/tokens-accumulates-4 pass one.txt
row lightning/accum2-momentum-3steps-clip acc/forgets-zero-grad fail one.txt
reason lightning/accum2-momentum-3steps-clip acc/forgets-zero-grad "step 1: gradients rel L2 error" one.txt
reason $t/n5/float32 acc/logs-elsewhere "step 0: no loss was logged" one.txt
row $t/n5/float32 acc/logs-as-train-loss pass one.txt
reason $t/clip-active/float32 acc/never-clips "step 0: clip_max_norm is 0.01 but clip_grad_norm_ never ran" one.txt

# 2 rank processes: the mean loop, exec'd (the default).
"$gradnorm" run --recipe "$mean" --nproc 2 -s dist/5-3/float32 > mean-dist.txt 2>&1
row tiny_transformer/dist/5-3/float32 accelerate/mean_loss.train fail mean-dist.txt
expect "every rank: step 0: gradients rel L2 error 0.244 > 1e-05" mean-dist.txt
# The rest forked warm from the supervisor (docs/ranks.md, "Warm rank processes"), as fuzz
# --nproc forks them, in one run: the token loop (--recipe), the mean loop on a rank with no
# valid token, even_batches as asked and not, and the feeding control.
export GRADNORM_WARM_RANKS=1
{
  variant accelerate/mean_loss.train "$mean"
  variant acc/reports-even-batches-false "accelerate:$tests:reports_even_batches" dataloader_config.even_batches=false
  variant acc/reports-even-batches "accelerate:$tests:reports_even_batches"
  variant acc/feeds-reversed "accelerate:$tests:feeds_reversed"
} > ranks.toml
d=tiny_transformer/dist
"$gradnorm" run --recipe "$tokens" --nproc 2 -f ranks.toml -s dist/5-3/float32 -s dist/accum2-ragged/float32 \
  -s dist/5-3-clip-active/float32 -s dist/0-8/float32 -f "$scenarios" -s 'lightning/dist*' > ranks.txt 2>&1
for s in dist/5-3/float32 dist/accum2-ragged/float32 dist/5-3-clip-active/float32 dist/0-8/float32; do
  row tiny_transformer/$s accelerate/token_loss.train pass ranks.txt
done
row lightning/dist-accum2-momentum-3steps-clip accelerate/token_loss.train pass ranks.txt
row $d/0-8/float32 accelerate/mean_loss.train fail ranks.txt
reason $d/0-8/float32 accelerate/mean_loss.train "every rank: step 0: gradients rel L2 error 0.5 > 1e-05" ranks.txt
row $d/5-3/float32 acc/reports-even-batches-false pass ranks.txt
expect "Accelerator(dataloader_config.even_batches=False)" ranks.txt
row $d/5-3/float32 acc/reports-even-batches error-mismatch ranks.txt
reason $d/5-3/float32 acc/reports-even-batches "even_batches is True, not False" ranks.txt
reason $d/5-3/float32 acc/feeds-reversed \
  "rank 1 step 0: the model was given input_ids that are not this window's micro-batches in order" ranks.txt

"$gradnorm" run --recipe "$tokens" --recipe-arg mixed_precision=bf16 -s single/n5/float32 > arg.txt 2>&1
echo "arg: exit $?" >> arg.txt
expect "mixed_precision is gradnorm's to set: the scenario's dtype is what is trained" arg.txt
expect "arg: exit 2" arg.txt
"$gradnorm" run --recipe "$tokens" --recipe-arg nonsense=1 -s single/n5/float32 > unknown.txt 2>&1
echo "unknown: exit $?" >> unknown.txt
expect "an Accelerate loop takes log_name=NAME or an argument of accelerate's Accelerator" unknown.txt
expect "unknown: exit 2" unknown.txt
"$gradnorm" run --recipe "$tokens" --recipe-arg dataloader_config.even=false -s single/n5/float32 \
  > field.txt 2>&1
echo "field: exit $?" >> field.txt
expect "dataloader_config's fields are split_batches, dispatch_batches, even_batches" field.txt
expect "field: exit 2" field.txt
"$gradnorm" run --recipe "accelerate:$source_dir/examples/accelerate/mean_loss.py:nope" \
  -s single/n5/float32 > missing.txt 2>&1
echo "missing: exit $?" >> missing.txt
expect "defines no function named 'nope'" missing.txt
expect "missing: exit 2" missing.txt

exit $failed
