#!/usr/bin/env bash
# The project's test command (README "Testing"), also what CI runs.
# Installs what is missing (as root; otherwise says what to install), then checks formatting
# and lints, and runs every test suite against real processes.
set -euo pipefail
cd "$(dirname "$0")/.."

need() { command -v "$1" >/dev/null 2>&1; }

if ! need cargo; then
    echo "cargo is required: install Rust 1.88 or newer (https://rustup.rs)" >&2
    exit 1
fi

# Real Redis for the redis backend and Lua tests, faketime to skew a server's clock, the
# openssl command for the TLS tests' certificates, and OpenSSL's headers with pkg-config to
# build Redis TLS support (native-tls links the system OpenSSL) (Debian's packages).
if ! need redis-server || ! need redis-cli || ! need faketime || ! need openssl \
    || ! pkg-config --exists openssl 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && need apt-get; then
        echo "== installing redis-server, redis-tools, faketime, openssl, libssl-dev, pkg-config"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools faketime openssl libssl-dev \
            pkg-config >/dev/null
        # The package may start a system-wide server; the tests start their own.
        service redis-server stop >/dev/null 2>&1 || true
    else
        echo "required: apt-get install redis-server redis-tools faketime openssl libssl-dev pkg-config" >&2
        exit 1
    fi
fi

echo "== format and lints"
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings

echo "== tests"
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --locked --no-fail-fast
else
    cargo test --locked --no-fail-fast
fi
