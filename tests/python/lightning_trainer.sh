#!/usr/bin/env bash
# ctest: PyTorch Lightning's Trainer.fit, unmodified (lightning 2.6.6, requirements.txt), on the
# LightningModules of examples/lightning/ and tests/python/lightning/, and Lightning Fabric
# running the loops of examples/fabric/ and tests/python/lightning/loops.py, judged on catalogue
# scenarios with examples/python/tiny_transformer.py: on one device in-process and on 2 rank
# processes over Gloo DDP; every duty of the adapter with a negative control (what it feeds,
# captures, clips, logs, resets); Lightning's own argument parser for --recipe-arg; bad input
# (exit 2). The figures are the ones measured and explained in docs/findings.md ("PyTorch
# Lightning"). Skips (77) where lightning is not installed.
# Arguments: GRADNORM_BINARY SOURCE_DIR WORK_DIR
set -uo pipefail
gradnorm="$1"
source_dir="$2"
work="$3"
python="${GRADNORM_PYTHON:?set it to the environment python, as ctest does}"
v25="$(dirname "$(dirname "$python")")/lightning-2.5.6"
source "$(dirname "${BASH_SOURCE[0]}")/require_packages.sh"
for env in "" "$v25"; do require_packages "$env" lightning pytorch_lightning; done
source "$(dirname "${BASH_SOURCE[0]}")/script_common.sh"
unset PYTHONPATH
examples=$source_dir/examples/lightning
tests=$source_dir/tests/python/lightning
mean=lightning:$examples/mean_loss.py:MeanLoss
tokens=lightning:$examples/token_normalised.py:TokenNormalised
scenarios=$tests/scenarios.toml

# One device. The idiomatic module (each micro-batch's mean, Lightning divides by
# accumulate_grad_batches): right with one micro-batch a window, over several steps with
# momentum and with clipping active; wrong on ragged accumulation, where it also logs the last
# micro-batch's mean.
"$gradnorm" run --recipe "$mean" -s single/n5/float32 -s single/clip-active/float32 \
  -s single/n5-momentum-3steps/float32 -s single/accum2-ragged/float32 \
  -s single/accum2-empty-first-mean_ce/float32 -s single/all-masked-mean_ce/float32 \
  --json mean.json --markdown mean.md > mean.txt 2>&1
echo "mean: exit $?" >> mean.txt
row tiny_transformer/single/n5/float32 lightning/mean_loss.MeanLoss pass mean.txt
row tiny_transformer/single/clip-active/float32 lightning/mean_loss.MeanLoss pass mean.txt
row tiny_transformer/single/n5-momentum-3steps/float32 lightning/mean_loss.MeanLoss pass mean.txt
row tiny_transformer/single/accum2-ragged/float32 lightning/mean_loss.MeanLoss fail mean.txt
expect "step 0: gradients rel L2 error 0.289 > 1e-05" mean.txt
expect "step 0: logged loss 1.96246243, oracle 2.36283561" mean.txt
row tiny_transformer/single/accum2-empty-first-mean_ce/float32 lightning/mean_loss.MeanLoss fail mean.txt
expect "step 0: gradients rel L2 error 0.5 > 1e-05" mean.txt
row tiny_transformer/single/all-masked-mean_ce/float32 lightning/mean_loss.MeanLoss error-mismatch mean.txt
expect "mean: exit 1" mean.txt
expect "lightning/mean_loss.MeanLoss is $examples/mean_loss.py:MeanLoss (lightning 2.6.6's Trainer), unmodified" mean.txt
expect "(lightning 2.6.6's Trainer), unmodified" mean.json
expect "(lightning 2.6.6's Trainer), unmodified" mean.md

# The module normalising by the window's and the ranks' tokens: right on ragged accumulation,
# with an empty micro-batch, with the first label valid, clipping, and several steps.
"$gradnorm" run --recipe "$tokens" -s single/accum2-ragged/float32 -s single/accum4-ragged/float32 \
  -s single/accum2-empty-first-mean_ce/float32 -s first-valid/single/accum2-ragged/float32 \
  -s single/accum2-clip-active/float32 -f "$scenarios" -s 'lightning/accum2*' > tokens.txt 2>&1
echo "tokens: exit $?" >> tokens.txt
for s in single/accum2-ragged/float32 single/accum4-ragged/float32 \
         single/accum2-empty-first-mean_ce/float32 first-valid/single/accum2-ragged/float32 \
         single/accum2-clip-active/float32; do
  row tiny_transformer/$s lightning/token_normalised.TokenNormalised pass tokens.txt
done
row lightning/accum2-momentum-3steps-clip lightning/token_normalised.TokenNormalised pass tokens.txt
expect "tokens: exit 0" tokens.txt

# The partial last window: accumulate_grad_batches=3 on a one-step scenario of 2 micro-batches
# (and of 1): Lightning steps at the epoch's end and still divides each loss by 3.
"$gradnorm" run --recipe "$mean" --recipe-arg accumulate_grad_batches=3 -s single/n5/float32 \
  -s single/accum2-ragged/float32 -s single/n5-momentum-3steps/float32 > partial.txt 2>&1
row tiny_transformer/single/n5/float32 lightning/mean_loss.MeanLoss fail partial.txt
expect "step 0: gradients rel L2 error 0.667 > 1e-05" partial.txt
row tiny_transformer/single/accum2-ragged/float32 lightning/mean_loss.MeanLoss fail partial.txt
expect "step 0: gradients rel L2 error 0.429 > 1e-05" partial.txt
expect "1 pairs left out" partial.txt
"$gradnorm" run --recipe "$tokens" --recipe-arg accumulate_grad_batches=3 -s single/n5/float32 \
  -s single/accum2-ragged/float32 > partial-tokens.txt 2>&1
row tiny_transformer/single/accum2-ragged/float32 lightning/token_normalised.TokenNormalised pass partial-tokens.txt

# gradient_clip_val from the command line: every scenario clips to it, named for it.
"$gradnorm" run --recipe "$tokens" --recipe-arg gradient_clip_val=0.05 -s single/accum2-ragged/float32 \
  > clip-arg.txt 2>&1
row "tiny_transformer/single/accum2-ragged/float32@gradient_clip_val=0.05" lightning/token_normalised.TokenNormalised pass clip-arg.txt

# 2 rank processes over Gloo DDP.
"$gradnorm" run --recipe "$mean" --nproc 2 -s dist/5-3/float32 -s dist/4-4/float32 > mean-dist.txt 2>&1
row tiny_transformer/dist/5-3/float32 lightning/mean_loss.MeanLoss fail mean-dist.txt
expect "every rank: step 0: gradients rel L2 error 0.244 > 1e-05" mean-dist.txt
row tiny_transformer/dist/4-4/float32 lightning/mean_loss.MeanLoss fail mean-dist.txt
expect "every rank: step 0: logged loss 2.43944097, oracle 2.41161241" mean-dist.txt
# The rank processes below are forked warm from the supervisor (docs/ranks.md, "Warm rank
# processes"), as fuzz --nproc forks them; the run above exec'd its ranks, the default.
export GRADNORM_WARM_RANKS=1
"$gradnorm" run --recipe "$tokens" --nproc 2 -s dist/5-3/float32 -s dist/accum2-ragged/float32 \
  -s dist/5-3-clip-active/float32 -s first-valid/dist/5-3/float32 -f "$scenarios" -s 'lightning/dist*' \
  > tokens-dist.txt 2>&1
echo "tokens-dist: exit $?" >> tokens-dist.txt
for s in dist/5-3/float32 dist/accum2-ragged/float32 dist/5-3-clip-active/float32 first-valid/dist/5-3/float32; do
  row tiny_transformer/$s lightning/token_normalised.TokenNormalised pass tokens-dist.txt
done
row lightning/dist-accum2-momentum-3steps-clip lightning/token_normalised.TokenNormalised pass tokens-dist.txt
expect "tokens-dist: exit 0" tokens-dist.txt

# pytorch_lightning's Trainer for a module of that name, in one run with the negative controls,
# one per duty of the adapter, each a module patched through Lightning's own hooks
# (tests/python/lightning/modules.py, as the variants of controls.toml), each on the scenarios
# of every control.
"$gradnorm" run --recipe "lightning:$tests/pl_mean_loss.py:PlMeanLoss" -f "$tests/controls.toml" \
  -s single/n5/float32 -s single/n5-momentum-3steps/float32 -s single/accum2-ragged/float32 \
  -s single/clip-active/float32 > controls.txt 2>&1
n5=tiny_transformer/single/n5/float32
row $n5 lightning/pl_mean_loss.PlMeanLoss pass controls.txt
expect "(pytorch_lightning 2.6.6's Trainer), unmodified" controls.txt
# Resets: zero_grad skipped piles each step's gradients onto the last's.
row tiny_transformer/single/n5-momentum-3steps/float32 controls/forgets-zero-grad fail controls.txt
reason tiny_transformer/single/n5-momentum-3steps/float32 controls/forgets-zero-grad \
  "step 1: gradients rel L2 error 0.887 > 1e-05" controls.txt
# Feeds: what reached the model is checked against the scenario's micro-batches.
row tiny_transformer/single/accum2-ragged/float32 controls/feeds-reversed error-mismatch controls.txt
reason tiny_transformer/single/accum2-ragged/float32 controls/feeds-reversed \
  "rank 0 step 0: the model was given input_ids that are not this window's micro-batches in order" controls.txt
# Logs: nothing under "loss", or another value than the loss.
reason $n5 controls/skips-log "step 0: no loss was logged" controls.txt
row $n5 controls/logs-as-train-loss pass controls.txt
reason $n5 controls/logs-doubled "step 0: logged loss 4.53319073, oracle 2.26659533" controls.txt
# Clips: a module clipping to a tenth of the norm it was given.
row tiny_transformer/single/clip-active/float32 controls/clips-twice fail controls.txt
reason tiny_transformer/single/clip-active/float32 controls/clips-twice \
  "step 0: gradients rel L2 error 0.9 > 1e-05" controls.txt
# The resets and the feeds on 2 rank processes (with the other controls, which cost little).
"$gradnorm" run --recipe "lightning:$tests/modules.py:ForgetsZeroGrad" --nproc 2 -f "$scenarios" \
  -f "$tests/controls.toml" -s 'lightning/dist*' -s dist/5-3/float32 \
  > controls-dist.txt 2>&1
row lightning/dist-accum2-momentum-3steps-clip lightning/modules.ForgetsZeroGrad fail controls-dist.txt
reason lightning/dist-accum2-momentum-3steps-clip lightning/modules.ForgetsZeroGrad \
  "every rank: step 1: gradients rel L2 error" controls-dist.txt
reason tiny_transformer/dist/5-3/float32 controls/feeds-reversed \
  "rank 1 step 0: the model was given input_ids that are not this window's micro-batches in order" controls-dist.txt

# Lightning 2.5.6 (requirements-lightning25.txt's folder, first on PYTHONPATH): the same
# figures, from the same lines (automatic.py:83 and :329 in both versions).
PYTHONPATH="$v25" "$gradnorm" run --recipe "$mean" -s single/accum2-ragged/float32 \
  -s single/n5/float32 > v25.txt 2>&1
row tiny_transformer/single/accum2-ragged/float32 lightning/mean_loss.MeanLoss fail v25.txt
expect "step 0: gradients rel L2 error 0.289 > 1e-05" v25.txt
row tiny_transformer/single/n5/float32 lightning/mean_loss.MeanLoss pass v25.txt
expect "(lightning 2.5.6's Trainer), unmodified" v25.txt
PYTHONPATH="$v25" "$gradnorm" run --recipe "$tokens" --nproc 2 -s dist/5-3/float32 > v25-dist.txt 2>&1
row tiny_transformer/dist/5-3/float32 lightning/token_normalised.TokenNormalised pass v25-dist.txt

# Lightning Fabric: a user's loop (examples/fabric/loops.py), one device and 2 ranks.
loops=$source_dir/examples/fabric/loops.py
# With the loop, its negative controls (tests/python/lightning/loops.py, as the variants of
# fabric_controls.toml): resets, feeds, logs, clips, each on the scenarios of every control.
"$gradnorm" run --recipe "fabric:$loops:mean_loop" -f "$tests/fabric_controls.toml" -f "$scenarios" \
  -s single/n5/float32 -s single/accum2-ragged/float32 -s single/clip-active/float32 \
  -s 'lightning/accum2*' > fabric-mean.txt 2>&1
row $n5 fabric/loops.mean_loop pass fabric-mean.txt
row tiny_transformer/single/accum2-ragged/float32 fabric/loops.mean_loop fail fabric-mean.txt
reason tiny_transformer/single/accum2-ragged/float32 fabric/loops.mean_loop \
  "step 0: gradients rel L2 error 0.289 > 1e-05" fabric-mean.txt
expect "fabric/loops.mean_loop is $loops:mean_loop (lightning 2.6.6's Fabric), unmodified" fabric-mean.txt
row lightning/accum2-momentum-3steps-clip fabric-controls/forgets-zero-grad fail fabric-mean.txt
reason lightning/accum2-momentum-3steps-clip fabric-controls/forgets-zero-grad \
  "step 1: gradients rel L2 error" fabric-mean.txt
reason tiny_transformer/single/accum2-ragged/float32 fabric-controls/feeds-reversed \
  "rank 0 step 0: the model was given input_ids that are not this window's micro-batches in order" fabric-mean.txt
reason $n5 fabric-controls/logs-elsewhere "step 0: no loss was logged" fabric-mean.txt
row $n5 fabric-controls/logs-as-train-loss pass fabric-mean.txt
reason tiny_transformer/single/clip-active/float32 fabric-controls/never-clips \
  "step 0: clip_max_norm is 0.01 but clip_grad_norm_ never ran" fabric-mean.txt
"$gradnorm" run --recipe "fabric:$loops:token_loop" -s single/accum2-ragged/float32 \
  -s single/accum2-clip-active/float32 -s single/accum2-empty-first-mean_ce/float32 \
  -f "$scenarios" -s 'lightning/accum2*' > fabric-tokens.txt 2>&1
echo "fabric-tokens: exit $?" >> fabric-tokens.txt
for s in single/accum2-ragged/float32 single/accum2-clip-active/float32 single/accum2-empty-first-mean_ce/float32; do
  row tiny_transformer/$s fabric/loops.token_loop pass fabric-tokens.txt
done
row lightning/accum2-momentum-3steps-clip fabric/loops.token_loop pass fabric-tokens.txt
expect "fabric-tokens: exit 0" fabric-tokens.txt
"$gradnorm" run --recipe "fabric:$loops:mean_loop" --nproc 2 -s dist/5-3/float32 > fabric-mean-dist.txt 2>&1
row tiny_transformer/dist/5-3/float32 fabric/loops.mean_loop fail fabric-mean-dist.txt
expect "every rank: step 0: gradients rel L2 error 0.244 > 1e-05" fabric-mean-dist.txt
"$gradnorm" run --recipe "fabric:$loops:token_loop" --nproc 2 -s dist/5-3-clip-active/float32 \
  -f "$scenarios" -s 'lightning/dist*' > fabric-tokens-dist.txt 2>&1
row tiny_transformer/dist/5-3-clip-active/float32 fabric/loops.token_loop pass fabric-tokens-dist.txt
row lightning/dist-accum2-momentum-3steps-clip fabric/loops.token_loop pass fabric-tokens-dist.txt

# Bad input: exit 2 before anything runs, naming what is wrong.
bad() {  # bad NAME TEXT ARGS...: exit 2 and TEXT in the message
  local name=$1 text=$2
  shift 2
  "$gradnorm" run "$@" -s single/n5/float32 > "$name.txt" 2>&1
  echo "$name: exit $?" >> "$name.txt"
  expect "$name: exit 2" "$name.txt"
  expect "$text" "$name.txt"
}
bad owned "the scenario decides max_steps (steps)" --recipe "$mean" --recipe-arg max_steps=3
bad refused "lightning 2.6.6's Trainer argument parser refuses detect_anomaly=maybe" \
  --recipe "$mean" --recipe-arg detect_anomaly=maybe
bad unknown-arg "refuses no_such_argument=1" --recipe "$mean" --recipe-arg no_such_argument=1
bad no-class "defines no LightningModule subclass named 'NotAModule'" \
  --recipe "lightning:$tests/modules.py:NotAModule"
bad function "defines no LightningModule subclass named 'not_a_class'" \
  --recipe "lightning:$tests/modules.py:not_a_class"
bad no-file "no such file" --recipe lightning:no_such_file.py:MeanLoss
bad no-class-name "expected lightning:PATH.py:CLASS" --recipe "lightning:$examples/mean_loss.py"
bad fabric-arg "a Fabric loop takes log_name=NAME only" --recipe "fabric:$loops:token_loop" \
  --recipe-arg devices=4
bad fabric-class "defines no function named 'MeanLoss'" --recipe "fabric:$examples/mean_loss.py:MeanLoss"
bad negative-clip "gradient_clip_val is a number >= 0 (0: no clipping)" \
  --recipe "$mean" --recipe-arg gradient_clip_val=-1

exit $failed
