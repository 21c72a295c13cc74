#!/usr/bin/env bash
# ctest: torchtune's own Llama 3 decoder (examples/torchtune/tiny_llama.py), built by the
# installed torchtune, trained by gradnorm's steps and judged: on one device and on [5, 3]
# in float32 and bfloat16 with threads, FSDP2 around it on 2 rank processes, refused in
# float64. Skips (77) where torchtune is not installed, saying why.
# Arguments: GRADNORM_BINARY SOURCE_DIR WORK_DIR
set -uo pipefail
gradnorm="$1"
source_dir="$2"
work="$3"
source "$(dirname "${BASH_SOURCE[0]}")/torchtune_common.sh"
models="$source_dir/examples/torchtune/models.toml"

"$gradnorm" run -f "$models" -v baseline -v skip -v 'broken/*' > threads.txt 2>&1
echo "threads: exit $?" >> threads.txt
expect "15 rows: 8 pass, 7 fail" threads.txt
expect "negative controls caught 3/3; documented findings reproduced 2; unexpected 0" threads.txt
expect "threads: exit 0" threads.txt

"$gradnorm" run --nproc 2 -f "$models" -s 'torchtune-llama/5-3/*' -v baseline -v skip \
  --python-step "$source_dir/examples/python/fsdp2.py" > fsdp2.txt 2>&1
echo "fsdp2: exit $?" >> fsdp2.txt
expect "6 rows: 4 pass, 2 fail" fsdp2.txt
expect "documented findings reproduced 2; unexpected 0" fsdp2.txt
expect "fsdp2: exit 0" fsdp2.txt

# Negative control of the dtype rule: float64 is refused before any row runs.
printf '[[scenario]]\nname = "torchtune-llama/5-3/float64"\nvalid_tokens = [[5], [3]]\nmodel = "python:%s"\nhidden_size = 8\ndtype = "float64"\n' \
  "$source_dir/examples/torchtune/tiny_llama.py:tiny_llama" > float64.toml
"$gradnorm" run -f float64.toml > float64.txt 2>&1
echo "float64: exit $?" >> float64.txt
expect "forward returned float32 logits for float64 parameters; expected float64" float64.txt
expect "float64: exit 2" float64.txt
exit $failed
