#!/usr/bin/env bash
# Install Debian's chromium and its matching chromedriver when either is missing.
#
# The dashboard test (tests/metrics/test_dashboard_browser.py) drives /usr/bin/chromium
# headless through Selenium and /usr/bin/chromedriver; nothing is downloaded by Selenium
# (the driver path is given explicitly). Both packages come from the same Debian source
# package, so the driver always matches the browser. Idempotent.
set -euo pipefail

log() { printf '[install_chromium] %s\n' "$*" >&2; }

if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    log "present: $(chromium --version 2>/dev/null | head -n 1)"
    exit 0
fi
if ! command -v apt-get >/dev/null || [ "$(id -u)" != 0 ]; then
    log "chromium/chromedriver are missing; install Debian's 'chromium' and 'chromium-driver'"
    log "packages as root and run this again"
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
log "installed: $(chromium --version 2>/dev/null | head -n 1)"
