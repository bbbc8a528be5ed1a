#!/usr/bin/env bash
# Install redis-server from Debian's `redis-server` package when it is missing.
#
# The queue, API, fault and plane tests start their own throwaway redis-server (a free port, no
# persistence; tests/redis_server.py) and never use a system Redis service. Without the binary
# those tests would skip, so `make test` runs this first. Idempotent: does nothing when
# redis-server is on PATH.
set -euo pipefail

log() { printf '[install_redis] %s\n' "$*" >&2; }

if command -v redis-server >/dev/null; then
    log "present: $(redis-server --version | head -n 1)"
    exit 0
fi
if ! command -v apt-get >/dev/null || [ "$(id -u)" != 0 ]; then
    log "redis-server is missing; install Debian's 'redis-server' package as root"
    log "(apt-get install -y --no-install-recommends redis-server) and run this again"
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends redis-server >/dev/null
log "installed: $(redis-server --version | head -n 1)"
