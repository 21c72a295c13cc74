#!/usr/bin/env python3
"""Starts worker processes the way torchrun's elastic agent does, for tests.

torchrun's agent (torch.distributed.elastic, LocalElasticAgent with the static rendezvous)
serves a TCPStore on MASTER_ADDR:MASTER_PORT itself, sets RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
TORCHELASTIC_USE_AGENT_STORE=True, TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT and
TORCHELASTIC_MAX_RESTARTS for each worker, watches them, and when one fails stops the rest
and exits non-zero. This does the same with the environment's torch (run it with .venv's
python), with one difference a test needs: it never stops a worker itself (but for a safety
deadline), so the test sees whether the other workers end on their own, and how soon, once
one of them has failed. As torch 2.x's agent does for each restart, it serves a fresh store,
whose keys carry no attempt prefix (torch/distributed/rendezvous.py, _create_c10d_store).

Usage: torchrun_agent.py [--nproc N] [--restart-count K] [--port P]
                         [--max-seconds S] -- COMMAND [ARGS...]
Prints, on stderr, one line per worker: "agent: worker R exited with STATUS after T s".
Exits 0 when every worker exited 0, else 1 (as torchrun does after a failed group).
"""
import argparse
import datetime
import os
import signal
import socket
import subprocess
import sys
import time

from torch.distributed import TCPStore


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--restart-count", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=300,
                        help="safety net: kill the workers after this long")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no worker command after --")

    port = args.port or free_port()
    # As the agent's static rendezvous does: the store's server lives in the agent.
    store = TCPStore("127.0.0.1", port, args.nproc, True,
                     datetime.timedelta(seconds=60), wait_for_workers=False)

    workers = []
    start = time.monotonic()
    for rank in range(args.nproc):
        env = dict(os.environ)
        for key in ("GRADNORM_STORE", "GRADNORM_STATUS_DIR"):
            env.pop(key, None)
        env.update({
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(args.nproc),
            "LOCAL_WORLD_SIZE": str(args.nproc), "GROUP_RANK": "0",
            "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(args.nproc), "ROLE_NAME": "default",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "test-agent",
            "TORCHELASTIC_RESTART_COUNT": str(args.restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(args.restart_count),
        })
        workers.append(subprocess.Popen(command, env=env, start_new_session=True))

    status = [None] * args.nproc
    failed = False
    while any(s is None for s in status):
        for rank, worker in enumerate(workers):
            if status[rank] is None and worker.poll() is not None:
                status[rank] = worker.returncode
                print(f"agent: worker {rank} exited with {worker.returncode} after "
                      f"{time.monotonic() - start:.1f} s", file=sys.stderr, flush=True)
                failed = failed or worker.returncode != 0
        if time.monotonic() - start > args.max_seconds:
            print(f"agent: workers still running after {args.max_seconds} s: killing them",
                  file=sys.stderr, flush=True)
            for rank, worker in enumerate(workers):
                if status[rank] is None:
                    os.killpg(worker.pid, signal.SIGKILL)
            failed = True
        time.sleep(0.05)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
