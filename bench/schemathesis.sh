#!/bin/bash
# schemathesis --checks all against a real `bayesgate serve` (bundled model, default settings),
# with the false positives of bench/schemathesis.toml. Usage: bench/schemathesis.sh [N] [SEED]
# (N examples per operation and phase, default 100: about 2,300-2,900 generated cases).
set -u
cd "$(dirname "$0")/.."
N=${1:-100}
SEED=${2:-1}
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
OUT=${OUT:-/tmp/bayesgate-schemathesis}
mkdir -p "$OUT"
export BAYESGATE_NUM_THREADS=1 OMP_NUM_THREADS=1 BAYESGATE_LOG_FORMAT=json
.venv/bin/bayesgate serve --host 127.0.0.1 --port "$PORT" >/dev/null 2>"$OUT/server.log" &
SERVER=$!
trap 'kill -INT $SERVER 2>/dev/null; wait $SERVER' EXIT
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null && break
  sleep 1
done
ROOT=$(pwd)
cd "$OUT" || exit 1  # schemathesis keeps a .schemathesis/ cache in its working directory
"$ROOT/.venv/bin/schemathesis" --config-file "$ROOT/bench/schemathesis.toml" run \
  "http://127.0.0.1:$PORT/openapi.json" --checks all -n "$N" --seed "$SEED" \
  --continue-on-failure --request-timeout 60 --generation-database none \
  --report junit --report-dir "$OUT"
status=$?
echo "server 5xx/tracebacks in its log: $(grep -c '"status": 5[0-9][0-9]\|Traceback' "$OUT/server.log")"
exit $status
