#!/usr/bin/env bash
# Run CMD with this machine's long runs (bench/long_runs.py's `bayesgate train` / `bayesgate uci`,
# whose outputs live in the user cache) paused (SIGSTOP), and resume them afterwards (SIGCONT, also
# when CMD fails or is interrupted). Other trainings (a test suite's, in temporary directories) are
# left running. Timing commands in the docs are written with it:
#   bench/quiet.sh python bench/load.py --duration 10
set -u
cache="${XDG_CACHE_HOME:-$HOME/.cache}/bayesgate/"
pids=$(pgrep -f "bayesgate (train|uci) .*${cache}" | tr '\n' ' ')
if [ -n "$pids" ]; then
    kill -STOP $pids
    trap 'kill -CONT $pids' EXIT
fi
"$@"
