#!/usr/bin/env bash
# Install prometheus and promtool from Debian's `prometheus` package when either is missing.
#
# The metric tests (tests/metrics) run `promtool test rules` on the alert rules and start their
# own `prometheus` binary (temporary config and data directory, a free port) to scrape a live
# control plane; they never use a system Prometheus service. CI runs as root on Debian 12
# (bookworm), where the package is prometheus 2.42.0+ds; the version is the Debian release's,
# reported below. Idempotent: does nothing when both binaries are on PATH.
set -euo pipefail

log() { printf '[install_prometheus] %s\n' "$*" >&2; }

if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
    log "present: $(prometheus --version 2>&1 | head -n 1)"
    exit 0
fi
if ! command -v apt-get >/dev/null || [ "$(id -u)" != 0 ]; then
    log "prometheus/promtool are missing; install Debian's 'prometheus' package as root"
    log "(apt-get install -y --no-install-recommends prometheus) and run this again"
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# --no-install-recommends: no node exporter; the package's service is never relied on.
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
log "installed: $(prometheus --version 2>&1 | head -n 1)"
