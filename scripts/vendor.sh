#!/usr/bin/env bash
# Copies the source of every crate Cargo.lock names into vendor/ (or the directory given), so
# the container image builds with no network: `scripts/vendor.sh && docker build .`
#
# This is the one step that may reach crates.io (for crates not yet in ~/.cargo). It writes,
# inside the vendor directory, cargo-config.toml: the source replacement that points cargo at
# the vendored copies. The Dockerfile installs it as the build's .cargo/config.toml; it is
# never installed in the working tree, so a developer's own builds keep using crates.io.
# Its `directory` is the vendor directory's own name, which cargo reads relative to the
# directory above the file's: the Dockerfile's /src/.cargo/config.toml finds /src/vendor, and
# `cargo --config DIR/cargo-config.toml` finds DIR itself.
#
# Every crate of the workspace (the server and clients/rust), for every platform, is copied:
# cargo resolves the whole lock file even when it builds for one target.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-$repo/vendor}"
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"

# Run from the directory above, naming the destination by its base name, so the snippet cargo
# prints says `directory = "<name>"` rather than this machine's absolute path.
# (cargo vendor empties the destination first, so the snippet is written after it.)
config="$(cd "$(dirname "$dest")" \
    && cargo vendor --manifest-path "$repo/Cargo.toml" --locked "$(basename "$dest")")"
case "$config" in
    *'replace-with = "vendored-sources"'*) printf '%s\n' "$config" > "$dest/cargo-config.toml" ;;
    *) echo "vendor.sh: cargo vendor printed no source replacement" >&2; exit 1 ;;
esac
echo "vendored $(find "$dest" -mindepth 1 -maxdepth 1 -type d | wc -l) crates into $dest"
