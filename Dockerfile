# syntax=docker/dockerfile:1
# floodgate's container image, built with no network from vendored crates:
#
#   scripts/vendor.sh
#   docker build -t floodgate --build-arg VERSION=0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" .
#
# The Helm chart (helm/floodgate) runs it by default as ghcr.io/floodgate/floodgate;
# examples/compose runs it beside Envoy and Redis. tests/image proves what the final stage
# holds without a container engine (docs/image.md).
#
# Both bases are pinned by the digest of their multi-platform index, so a rebuild starts from
# the bytes that were reviewed. Refresh a digest with
#   docker buildx imagetools inspect rust:1.95.0-bookworm --format '{{json .Manifest.Digest}}'
#   docker buildx imagetools inspect gcr.io/distroless/cc-debian12:nonroot --format '{{json .Manifest.Digest}}'
# and change the tag and digest together.

# rust:1.95.0-bookworm: the toolchain the repository is tested with, and the C compiler that
# mimalloc and ring need. Digest as pinned by sondrateconsulting/jitgen's Dockerfile (commit
# 3dfcc3cdaf4c86a5704d44b76f8d96c1fd0917c7) and other public Dockerfiles.
FROM rust:1.95.0-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
WORKDIR /src

# The dependency layer: everything that decides which crates are built, and their vendored
# sources, but none of floodgate's own code. It is rebuilt only when the lock file, a
# manifest, build.rs, a .proto or the vendored crates change, not on every edit under src/.
# vendor/ and its cargo-config.toml (the source replacement) come from scripts/vendor.sh.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY clients/rust/Cargo.toml clients/rust/build.rs clients/rust/
COPY vendor vendor
COPY vendor/cargo-config.toml .cargo/config.toml
# Stub targets, so cargo can load the workspace (the bench is declared in Cargo.toml; the Rust
# client is a member but is not built here); `cargo clean -p floodgate` then removes what was
# built from the stubs, so the real sources below are compiled whatever their timestamps.
# --frozen is --locked and --offline: the lock file is used as is and nothing is fetched.
RUN --network=none \
    mkdir -p src benches clients/rust/src \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs benches/decision.rs clients/rust/src/lib.rs \
    && cargo build --release --frozen --locked --offline --bin floodgate \
    && cargo clean --release --frozen --locked --offline -p floodgate

# floodgate itself: the sources, and the Lua scripts compiled into the binary.
COPY src src
COPY lua lua
# Staged under /out as the final image lays it out. /bin/ratelimit is envoyproxy/ratelimit's
# entry point: started under that name, floodgate reads upstream's environment variables
# (Envoy Gateway and Istio's sample run /bin/ratelimit). The final stage has no shell, so the
# link is made here.
# REVISION: the commit `floodgate --version` names (the build context has no .git); set
# here, after the dependency layer, so a new commit rebuilds floodgate alone.
ARG REVISION=unknown
ENV FLOODGATE_COMMIT=${REVISION}
RUN --network=none \
    cargo build --release --frozen --locked --offline --bin floodgate \
    && install -D -m 0755 target/release/floodgate /out/usr/local/bin/floodgate \
    && mkdir -p /out/bin \
    && ln -s /usr/local/bin/floodgate /out/bin/ratelimit

# distroless cc (Debian 12, nonroot): glibc, libgcc_s, CA certificates, tzdata, /etc/passwd
# with nonroot (65532) and nothing else: no shell, no package manager, no OpenSSL in use
# (TLS is rustls). Digest as pinned by StephanMeijer/meneerhenk's Dockerfile (commit
# 1927ffa84cd3bae02bd8e6200df33701736b8fb3) and other public Dockerfiles.
FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
# VERSION is the server's (Cargo.toml, `floodgate --version`); REVISION the commit built.
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="floodgate" \
      org.opencontainers.image.description="A gRPC rate-limit decision service, wire-compatible with Envoy's RateLimitService" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="gcr.io/distroless/cc-debian12:nonroot" \
      org.opencontainers.image.base.digest="sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f"
COPY --from=build /out/ /
# The example rules, so the image serves something on its own; the chart and the compose
# example mount their rules over this directory.
COPY examples/rules /etc/floodgate/rules
# Inside a container the server must listen beyond loopback. Settings are read from the
# environment, so `docker run -e FLOODGATE_BACKEND=redis …` or the chart can change any.
ENV FLOODGATE_GRPC_ADDR=0.0.0.0:8081 \
    FLOODGATE_HTTP_ADDR=0.0.0.0:8080 \
    FLOODGATE_RULES=/etc/floodgate/rules
# distroless' nonroot user, by number so Kubernetes' runAsNonRoot can check it. floodgate
# writes nothing, so a read-only root filesystem works.
USER 65532:65532
EXPOSE 8081 8080
ENTRYPOINT ["/usr/local/bin/floodgate"]
CMD ["serve"]
