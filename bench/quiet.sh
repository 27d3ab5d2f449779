#!/usr/bin/env bash
# Run CMD with this machine's background trainings (`bayesgate train`, e.g. bench/long_runs.py's)
# paused (SIGSTOP), and resume them afterwards (SIGCONT, also when CMD fails or is interrupted).
# The docs' timing commands write it as /tmp/bg/quiet.sh, a copy of this file.
#   bench/quiet.sh python bench/load.py --duration 10
set -u
pids=$(pgrep -f "bayesgate train" | tr '\n' ' ')
if [ -n "$pids" ]; then
    kill -STOP $pids
    trap 'kill -CONT $pids' EXIT
fi
"$@"
