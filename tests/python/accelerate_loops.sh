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

"$gradnorm" run --recipe "$mean" -s single/n5/float32 -s single/clip-active/float32 \
  -s single/accum2-ragged/float32 -s single/accum2-empty-first-mean_ce/float32 > mean.txt 2>&1
row tiny_transformer/single/n5/float32 accelerate/mean_loss.train pass mean.txt
row tiny_transformer/single/clip-active/float32 accelerate/mean_loss.train pass mean.txt
row tiny_transformer/single/accum2-ragged/float32 accelerate/mean_loss.train fail mean.txt
expect "step 0: gradients rel L2 error 0.289 > 1e-05" mean.txt
row tiny_transformer/single/accum2-empty-first-mean_ce/float32 accelerate/mean_loss.train fail mean.txt
expect "step 0: gradients rel L2 error 0.5 > 1e-05" mean.txt
expect "accelerate/mean_loss.train is $source_dir/examples/accelerate/mean_loss.py:train (accelerate 1.16.0's Accelerator), unmodified" mean.txt
"$gradnorm" run --recipe "$tokens" -s single/accum2-ragged/float32 -s single/accum2-clip-active/float32 \
  -s single/accum2-empty-first-mean_ce/float32 -f "$scenarios" -s 'lightning/accum2*' > tokens.txt 2>&1
echo "tokens: exit $?" >> tokens.txt
for s in single/accum2-ragged/float32 single/accum2-clip-active/float32 single/accum2-empty-first-mean_ce/float32; do
  row tiny_transformer/$s accelerate/token_loss.train pass tokens.txt
done
row lightning/accum2-momentum-3steps-clip accelerate/token_loss.train pass tokens.txt
expect "tokens: exit 0" tokens.txt

"$gradnorm" run --recipe "$mean" --nproc 2 -s dist/5-3/float32 > mean-dist.txt 2>&1
row tiny_transformer/dist/5-3/float32 accelerate/mean_loss.train fail mean-dist.txt
expect "every rank: step 0: gradients rel L2 error 0.244 > 1e-05" mean-dist.txt
# The rank processes below are forked warm from the supervisor (docs/ranks.md, "Warm rank
# processes"), as fuzz --nproc forks them; the run above exec'd its ranks, the default.
export GRADNORM_WARM_RANKS=1
"$gradnorm" run --recipe "$tokens" --nproc 2 -s dist/5-3/float32 -s dist/accum2-ragged/float32 \
  -s dist/5-3-clip-active/float32 -f "$scenarios" -s 'lightning/dist*' > tokens-dist.txt 2>&1
echo "tokens-dist: exit $?" >> tokens-dist.txt
for s in dist/5-3/float32 dist/accum2-ragged/float32 dist/5-3-clip-active/float32; do
  row tiny_transformer/$s accelerate/token_loss.train pass tokens-dist.txt
done
row lightning/dist-accum2-momentum-3steps-clip accelerate/token_loss.train pass tokens-dist.txt
expect "tokens-dist: exit 0" tokens-dist.txt

# A rank with no valid token: the mean loop's rank 0 takes a mean over nothing.
"$gradnorm" run --recipe "$mean" --nproc 2 -s dist/0-8/float32 > empty-rank.txt 2>&1
row tiny_transformer/dist/0-8/float32 accelerate/mean_loss.train fail empty-rank.txt
expect "every rank: step 0: gradients rel L2 error 0.5 > 1e-05" empty-rank.txt
"$gradnorm" run --recipe "$tokens" --nproc 2 -s dist/0-8/float32 > empty-rank-tokens.txt 2>&1
row tiny_transformer/dist/0-8/float32 accelerate/token_loss.train pass empty-rank-tokens.txt

# The partial last window: accelerate's window of 4 ends with the data after 2 micro-batches.
for loop in mean tokens; do
  recipe=$mean
  [ $loop = tokens ] && recipe=$tokens
  "$gradnorm" run --recipe "$recipe" --recipe-arg gradient_accumulation_steps=4 \
    -s single/accum2-ragged/float32 > partial-$loop.txt 2>&1
done
row tiny_transformer/single/accum2-ragged/float32 accelerate/mean_loss.train fail partial-mean.txt
expect "step 0: gradients rel L2 error 0.558 > 1e-05" partial-mean.txt
expect "(accelerate 1.16.0's Accelerator(gradient_accumulation_steps=4))" partial-mean.txt
row tiny_transformer/single/accum2-ragged/float32 accelerate/token_loss.train pass partial-tokens.txt
# An Accelerator argument reaches the Accelerator: even_batches=False is what the loop sees.
"$gradnorm" run --recipe "accelerate:$tests:reports_even_batches" --nproc 2 \
  --recipe-arg dataloader_config.even_batches=false -s dist/5-3/float32 > even.txt 2>&1
row tiny_transformer/dist/5-3/float32 accelerate/loops.reports_even_batches pass even.txt
expect "Accelerator(dataloader_config.even_batches=False)" even.txt
"$gradnorm" run --recipe "accelerate:$tests:reports_even_batches" --nproc 2 -s dist/5-3/float32 \
  > even-default.txt 2>&1
row tiny_transformer/dist/5-3/float32 accelerate/loops.reports_even_batches error-mismatch even-default.txt
expect "even_batches is True, not False" even-default.txt

# Negative controls: resets, feeds, logs, clips.
"$gradnorm" run --recipe "accelerate:$tests:forgets_zero_grad" -f "$scenarios" -s 'lightning/accum2*' \
  > zero-grad.txt 2>&1
row lightning/accum2-momentum-3steps-clip accelerate/loops.forgets_zero_grad fail zero-grad.txt
expect "step 1: gradients rel L2 error" zero-grad.txt
"$gradnorm" run --recipe "accelerate:$tests:feeds_reversed" --nproc 2 -s dist/5-3/float32 > fed.txt 2>&1
expect "rank 1 step 0: the model was given input_ids that are not this window's micro-batches in order" fed.txt
"$gradnorm" run --recipe "accelerate:$tests:logs_elsewhere" -s single/n5/float32 > no-log.txt 2>&1
expect "step 0: no loss was logged" no-log.txt
"$gradnorm" run --recipe "accelerate:$tests:logs_elsewhere" --recipe-arg log_name=train_loss \
  -s single/n5/float32 > log-name.txt 2>&1
row tiny_transformer/single/n5/float32 accelerate/loops.logs_elsewhere pass log-name.txt
"$gradnorm" run --recipe "accelerate:$tests:never_clips" -s single/clip-active/float32 > clip.txt 2>&1
expect "step 0: clip_max_norm is 0.01 but clip_grad_norm_ never ran" clip.txt

# Bad input: exit 2 before anything runs.
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
