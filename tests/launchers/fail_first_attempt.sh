#!/usr/bin/env bash
# A torchrun worker whose rank 1 fails at once on the first attempt, so that the agent
# restarts the whole group (TORCHELASTIC_RESTART_COUNT=1); afterwards it runs the command.
# Usage: fail_first_attempt.sh COMMAND [ARGS...]
if [ "${TORCHELASTIC_RESTART_COUNT:-}" = 0 ] && [ "${RANK:-}" = 1 ]; then exit 1; fi
exec "$@"
