#!/usr/bin/env bash
# gradnorm's ranks under torchrun: under a launcher that serves the store as torchrun's agent
# does (torchrun_agent.py), and under the environment's own torchrun (torch 2.13), the distributed catalogue gives
# the same observation digests as gradnorm's own supervisor (the Gloo-process transport);
# a restarted group runs on its own store; and a rank that dies or hangs ends every rank, each naming
# it, with a non-zero exit that the launcher sees.
# Usage: torchrun_test.sh GRADNORM SOURCE_DIR WORK_DIR
set -euo pipefail
gradnorm=$(realpath "$1") source=$(realpath "$2") work=$(realpath -m "$3")
agent="$source/tests/launchers/torchrun_agent.py"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
source "$source/tests/launchers/common.sh"
python=${GRADNORM_PYTHON:?set it to the environment python, as ctest does}
free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The environment's own torchrun, as `torchrun` runs it (torch 2.13's defaults work on
# Python 3.11: the --redirects/--tee workaround torch 1.13 needed is gone).
torchrun=("$python" -m torch.distributed.run --no_python)

# Rank 0 reports for everyone; every rank is a client of the agent's store. 2 ranks on the
# whole distributed catalogue; 4 ranks, and every launch after these, on its float32 scenarios
# (every variant): what a launch varies is how ranks find each other, which the first rows
# settle, and each launch of the whole catalogue cost about 10 s (23 s with 4 ranks).
supervisor_digests 2
launched_digests agent2 2 env "gloo processes x 2 under torchrun (agent store)" \
  "torchrun agent's store, 2 ranks" "$python" "$agent" --nproc 2 --
scenarios='dist/*/float32'
supervisor_digests 4 "$scenarios"
launched_digests agent4 4 env "gloo processes x 4 under torchrun (agent store)" \
  "torchrun agent's store, 4 ranks" "$python" "$agent" --nproc 4 --

# A restart: the report names it; the attempt has a store of its own.
launched_digests restart 2 env "gloo processes x 2 under torchrun (agent store, restart 1)" \
  "torchrun agent's store, restart 1" \
  "$python" "$agent" --nproc 2 --restart-count 1 --

launched_digests torchrun 2 env "gloo processes x 2 under torchrun (agent store)" \
  "torchrun, 2 ranks" \
  "${torchrun[@]}" --nnodes 1 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$(free_port)"

# Two torchrun agents, as on two nodes (--nnodes 2, one worker each): node 1's agent and
# worker are clients of node 0's agent store, and the worker there has GROUP_RANK 1.
port=$(free_port)
pids=()
for node in 0 1; do
  "${torchrun[@]}" --nnodes 2 --node_rank "$node" --nproc_per_node 1 \
    --master_addr 127.0.0.1 --master_port "$port" \
    "$gradnorm" run --launcher env -s "$scenarios" -q --digests "nodes$node.tsv" \
    > "nodes$node.out" 2> "nodes$node.err" &
  pids+=($!)
done
for node in 0 1; do wait "${pids[$node]}" || fail "torchrun --nnodes 2, node $node: $(tail -5 "nodes$node.err")"; done
digests_of ref2.tsv "$scenarios" > ref2-nodes.tsv
same_digests ref2-nodes.tsv nodes0.tsv "two torchrun agents (--nnodes 2), 2 ranks"
[ ! -e nodes1.tsv ] && [ ! -s nodes1.out ] || fail "the worker on node 1 (rank 1) reported: $(cat nodes1.out)"

# A real restart: rank 1's first attempt fails, torchrun's agent restarts the group, and the
# second attempt runs on the fresh store the agent serves for it.
launched_digests restarted 2 env "gloo processes x 2 under torchrun (agent store, restart 1)" \
  "torchrun after a restart, 2 ranks" \
  "${torchrun[@]}" --nnodes 1 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$(free_port)" \
  --max_restarts 1 --monitor_interval 1 bash "$source/tests/launchers/fail_first_attempt.sh"

# torchrun --standalone: torch 2.13's c10d rendezvous shares the agent's store with the
# workers (TORCHELASTIC_USE_AGENT_STORE=True; elastic/rendezvous/dynamic_rendezvous.py,
# use_agent_store) unless TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, when rank 0 serves theirs.
launched_digests standalone 2 env "gloo processes x 2 under torchrun (agent store)" \
  "torchrun --standalone, 2 ranks" "${torchrun[@]}" --standalone --nproc_per_node 2
launched_digests standalone-own-store 2 env "gloo processes x 2 under torchrun (rank 0's store)" \
  "torchrun --standalone with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, 2 ranks" \
  env TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "${torchrun[@]}" --standalone --nproc_per_node 2

# Faults: the launcher must see a non-zero exit, every rank must end on its own (the agent
# never stops a worker; its 120 s safety net failing the test means a rank waited forever),
# and the survivors must name the rank at fault.
fault_case() {  # NAME FAULT EXPECTED_TEXT...
  local name=$1 fault=$2; shift 2
  local status=0
  "$python" "$agent" --nproc 2 --max-seconds 120 -- \
    "$gradnorm" run --launcher env -s dist/5-3/float32 -v baseline --timeout 5 -q \
    --inject-fault "$fault" > "$name.out" 2> "$name.err" || status=$?
  [ "$status" -ne 0 ] || fail "$name: the launcher saw exit 0"
  ! grep -q 'still running after' "$name.err" || fail "$name: a rank never ended: $(cat "$name.err")"
  [ "$(grep -c 'agent: worker [0-9] exited with [1-9]' "$name.err")" -eq 2 ] ||
    fail "$name: not every rank exited non-zero: $(grep 'agent:' "$name.err")"
  for text in "$@"; do
    grep -qF -- "$text" "$name.err" || fail "$name: no '$text' in: $(cat "$name.err")"
  done
  echo "ok: $name: $(grep -c 'agent: worker' "$name.err") ranks ended non-zero; $(grep -m1 'run aborted\|said nothing\|threw' "$name.err" | cut -c1-160)"
}
fault_case rank1-hangs 1:hang "rank 1 said nothing" "gradnorm: run aborted: rank 0"
fault_case rank0-hangs 0:hang "rank 0 said nothing"
fault_case rank1-dies 1:exit "rank 1 said nothing"
fault_case rank0-dies 0:exit "rank 0 said nothing"
fault_case rank1-throws 1:throw "rank 1 threw: injected fault"

# Without the agent, rank 0 serves the store: when it dies, rank 1 must not wait for it.
port=$(free_port)
status0=0 status1=0
env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
  "$gradnorm" run --launcher env -s dist/5-3/float32 -v baseline --timeout 5 -q --inject-fault 0:exit \
  > plain0.out 2> plain0.err & pid0=$!
env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" timeout 120 \
  "$gradnorm" run --launcher env -s dist/5-3/float32 -v baseline --timeout 5 -q --inject-fault 0:exit \
  > plain1.out 2> plain1.err || status1=$?
wait "$pid0" || status0=$?
[ "$status0" -ne 0 ] && [ "$status1" -ne 0 ] || fail "rank 0 died: exits $status0 and $status1"
[ "$status1" -ne 124 ] || fail "rank 1 waited for the dead rank 0 until killed"
grep -q 'rank 0' plain1.err || fail "rank 1 does not name rank 0: $(cat plain1.err)"
echo "ok: rank 0 (the store's server) died: rank 1 exited $status1: $(head -c 200 plain1.err)"

# A store that never answers: no rank waits forever for it.
port=$(free_port)
status=0
env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
  TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=0 timeout 120 \
  "$gradnorm" run --launcher env -s dist/5-3/float32 -v baseline --timeout 3 -q \
  > nostore.out 2> nostore.err || status=$?
[ "$status" -eq 3 ] || fail "no store: exit $status, not 3: $(cat nostore.err)"
grep -q "rendezvous failed" nostore.err || fail "no store: $(cat nostore.err)"
echo "ok: no store: exit 3: $(head -c 200 nostore.err)"

# Rank 0 serving a store that no other rank ever joins gives up after the timeout too.
port=$(free_port)
status=0
env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" timeout 120 \
  "$gradnorm" run --launcher env -s dist/5-3/float32 -v baseline --timeout 3 -q \
  > alone.out 2> alone.err || status=$?
[ "$status" -eq 3 ] || fail "rank 0 alone: exit $status, not 3: $(cat alone.err)"
grep -q "waited 3000 ms for the other 1 rank to connect" alone.err || fail "rank 0 alone: $(cat alone.err)"
echo "ok: rank 0 alone: exit 3: $(tail -c 200 alone.err)"

# torchrun's variables are checked like the others.
status=0
env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 TORCHELASTIC_USE_AGENT_STORE=yes \
  "$gradnorm" run --launcher env -s dist/5-3/float32 -q > bad.out 2> bad.err || status=$?
[ "$status" -eq 2 ] && grep -q 'TORCHELASTIC_USE_AGENT_STORE' bad.err ||
  fail "a malformed TORCHELASTIC_USE_AGENT_STORE: exit $status: $(cat bad.err)"
status=0
env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 TORCHELASTIC_USE_AGENT_STORE=True \
  "$gradnorm" run --launcher env -s dist/5-3/float32 -q > bad.out 2> bad.err || status=$?
[ "$status" -eq 2 ] && grep -q 'TORCHELASTIC_RESTART_COUNT' bad.err ||
  fail "the agent store without TORCHELASTIC_RESTART_COUNT: exit $status: $(cat bad.err)"
echo "ok: malformed torchrun variables are input errors (exit 2)"
echo "PASS"
