#!/usr/bin/env bash
# For a machine with NVIDIA GPUs: builds gradnorm with raw NCCL, runs the scenarios as rank
# processes over --backend nccl and again over --backend gloo, and compares every rank's
# observation digest between the two (equal digests: bit-identical observations).
#
#   bash scripts/nccl-check.sh [OUT_DIR]      (default build/nccl-check)
#
# World sizes: 1 always (the W=1 scenarios of the catalogue), then each world size of the
# dist/* scenarios that the GPUs can hold (one rank per GPU: rank r reduces on cuda:r). On a
# single GPU it also starts two ranks on that one device and prints what NCCL says to that.
# NCCL_CHECK_NO_BUILD=1 reuses build/tools/gradnorm (or the binary NCCL_CHECK_GRADNORM
# names); NCCL_CHECK_TIMEOUT sets --timeout (seconds, default 120); NCCL_CHECK_ONLY=REGEX
# keeps only the scenario names it matches.
#
# Exit status: 0 every compared digest is equal; 1 some differ or a run failed; 2 this
# machine cannot run the check (no GPU, no driver, a build without NCCL).
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-build/nccl-check}
gradnorm=${NCCL_CHECK_GRADNORM:-build/tools/gradnorm}
timeout_s=${NCCL_CHECK_TIMEOUT:-120}
only=${NCCL_CHECK_ONLY:-.}

cannot() {
  echo "nccl-check: $*" >&2
  exit 2
}

command -v nvidia-smi >/dev/null || cannot "nvidia-smi not found: this check needs NVIDIA GPUs and their driver"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
# Ranks index the devices CUDA shows them, so a CUDA_VISIBLE_DEVICES list bounds the count.
if [[ -n ${CUDA_VISIBLE_DEVICES+set} ]]; then
  IFS=, read -r -a visible <<<"${CUDA_VISIBLE_DEVICES}"
  if ((${#visible[@]} < gpus)); then gpus=${#visible[@]}; fi
fi
((gpus >= 1)) || cannot "no GPU to run on (nvidia-smi -L lists none, or CUDA_VISIBLE_DEVICES hides them)"
echo "nccl-check: $gpus GPU(s)"
nvidia-smi -L | sed 's/^/  /'

if [[ -z ${NCCL_CHECK_NO_BUILD:-} ]]; then
  # option() keeps the OFF an older configure cached; raw NCCL needs it ON.
  if [[ -f build/CMakeCache.txt ]] && grep -q '^GRADNORM_WITH_NCCL:BOOL=OFF' build/CMakeCache.txt; then
    cmake -B build -S . -DGRADNORM_WITH_NCCL=ON >/dev/null
  fi
  bash scripts/build.sh
fi
[[ -x $gradnorm ]] || cannot "$gradnorm is missing: build first (bash scripts/build.sh)"

mkdir -p "$out"
rm -f "$out"/*.tsv "$out"/*.log "$out"/*.diff
# One line per scenario: "NAME W=N ... [mesh=...]". NCCL runs refuse meshes (their subgroups
# run over Gloo), so both backends run the mesh-free scenarios only.
"$gradnorm" list --scenarios >"$out/catalogue.txt"
scenarios_of() {  # world size, name regex
  awk -v w="W=$1" -v pattern="$2" -v only="$only" \
    '$2 == w && $0 !~ / mesh=/ && $1 ~ pattern && $1 ~ only { print $1 }' "$out/catalogue.txt"
}

# Digests of a run: rc 0 (as expected) and 1 (unexpected verdicts) both leave them whole.
run_backend() {  # backend, world size, scenario names...
  local backend=$1 world=$2
  shift 2
  local selection=()
  for name in "$@"; do selection+=(-s "$name"); done
  local digests="$out/W${world}_${backend}.tsv"
  local rc=0
  "$gradnorm" run --launcher processes --nproc "$world" --backend "$backend" "${selection[@]}" \
    --timeout "$timeout_s" --digests "$digests" -q >"$out/W${world}_${backend}.log" 2>&1 || rc=$?
  echo "  $backend: exit $rc, $(tail -n 1 "$out/W${world}_${backend}.log")"
  if ((rc > 1)) || [[ ! -s $digests ]]; then
    echo "  $backend x $world failed (exit $rc); its output ends:" >&2
    tail -n 15 "$out/W${world}_${backend}.log" | sed 's/^/    /' >&2
    return 1
  fi
}

# Pairs the rows by (scenario, variant, rank); prints the counts and each differing row.
compare() {  # world size
  local gloo="$out/W$1_gloo.tsv" nccl="$out/W$1_nccl.tsv"
  diff "$gloo" "$nccl" >"$out/W$1.diff" || true
  awk -F'\t' '
    /^#/ { next }
    NR == FNR { gloo[$1 FS $2 FS $3] = $4; next }
    {
      key = $1 FS $2 FS $3
      if (!(key in gloo)) { unpaired++; print "    only over nccl: " key; next }
      if (gloo[key] == $4) { matching++ } else { differing++; print "    differs: " key " (gloo " gloo[key] ", nccl " $4 ")" }
      delete gloo[key]
    }
    END {
      for (key in gloo) { unpaired++; print "    only over gloo: " key }
      printf "  %d matching, %d differing, %d unpaired\n", matching, differing, unpaired
      exit (differing + unpaired > 0)
    }' "$gloo" "$nccl"
}

# One W=1 row first: a build without NCCL, or a machine NCCL cannot use, says so here (exit
# 2, the sentence naming what is missing) rather than as a failure of every world size.
first=$(scenarios_of 1 '.' | head -n 1)
[[ -n $first ]] || cannot "no W=1 scenario matches NCCL_CHECK_ONLY='$only'"
preflight_rc=0
"$gradnorm" run --launcher processes --nproc 1 --backend nccl -s "$first" -v baseline \
  --timeout "$timeout_s" -q >"$out/preflight.log" 2>&1 || preflight_rc=$?
if ((preflight_rc > 1)); then
  cannot "--backend nccl cannot run here (exit $preflight_rc): $(grep -v '^$' "$out/preflight.log" | tail -n 1)"
fi

worlds=(1)
mapfile -t dist_worlds < <(awk '$1 ~ /^dist\// && $0 !~ / mesh=/ { sub(/^W=/, "", $2); print $2 }' \
  "$out/catalogue.txt" | sort -nu)
for w in "${dist_worlds[@]}"; do
  if ((w == 1)); then continue; fi
  if ((w <= gpus)); then
    worlds+=("$w")
  else
    echo "nccl-check: skipping the dist/* scenarios of world size $w: they need $w GPUs"
  fi
done

status=0
summary=()
for w in "${worlds[@]}"; do
  if ((w == 1)); then pattern='.'; else pattern='^dist/'; fi
  mapfile -t names < <(scenarios_of "$w" "$pattern")
  if ((${#names[@]} == 0)); then continue; fi
  echo "nccl-check: world size $w, ${#names[@]} scenario(s)"
  ok=1
  run_backend nccl "$w" "${names[@]}" || ok=0
  run_backend gloo "$w" "${names[@]}" || ok=0
  if ((ok)); then
    if result=$(compare "$w"); then :; else status=1; fi
    echo "$result"
    summary+=("W=$w: $(tail -n 1 <<<"$result" | sed 's/^ *//')")
  else
    status=1
    summary+=("W=$w: a run failed (see $out/W${w}_*.log)")
  fi
done

# Two ranks on one device: not a configuration we support, run only to show NCCL's own
# answer to it. The supervisor would give rank 1 cuda:1 (and be refused before NCCL is
# reached), so both ranks are started by hand with LOCAL_RANK=0.
if ((gpus == 1)); then
  two=$(scenarios_of 2 '^dist/' | head -n 1)
  if [[ -n $two ]]; then
    echo "nccl-check: two ranks on the one GPU ($two), to show NCCL's error:"
    store="$out/two-ranks-one-gpu.store"
    rm -f "$store"
    pids=()
    for rank in 0 1; do
      RANK=$rank WORLD_SIZE=2 LOCAL_RANK=0 GRADNORM_STORE="file:$store" NCCL_DEBUG=WARN \
        "$gradnorm" run --launcher env --backend nccl -s "$two" --timeout 60 -q \
        >"$out/two-ranks-one-gpu.rank$rank.log" 2>&1 &
      pids+=($!)
    done
    for rank in 0 1; do
      rc=0
      wait "${pids[$rank]}" || rc=$?
      echo "  rank $rank: exit $rc"
      grep -v '^$' "$out/two-ranks-one-gpu.rank$rank.log" | tail -n 8 | sed 's/^/    /'
    done
  fi
fi

echo "nccl-check: summary (files in $out)"
for line in "${summary[@]}"; do echo "  $line"; done
if ((status != 0)); then
  echo "nccl-check: NCCL and Gloo digests differ, or a run failed" >&2
fi
exit "$status"
