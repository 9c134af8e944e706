# syntax=docker/dockerfile:1
# floodgate's container image: `docker build -t floodgate .` at the repository root.
# The Helm chart (helm/floodgate) runs it by default as ghcr.io/floodgate/floodgate.

FROM rust:1-bookworm AS build
# The image already has what the build needs: a C compiler (mimalloc, ring); protoc comes
# from the protoc-bin-vendored crate. TLS is rustls: no OpenSSL.
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin floodgate \
    && cp target/release/floodgate /usr/local/bin/floodgate

FROM debian:bookworm-slim
# ca-certificates: the system trust that Redis' and the xDS server's certificates are
# checked against when no CA file is set.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin/floodgate /usr/local/bin/floodgate
# envoyproxy/ratelimit's entry point: started under this name, floodgate reads upstream's
# environment variables (Envoy Gateway and Istio's sample run /bin/ratelimit).
RUN ln -s /usr/local/bin/floodgate /bin/ratelimit
# The example rules, so the image serves something on its own; the chart mounts its
# ConfigMap over this directory.
COPY examples/rules /etc/floodgate/rules
# Inside a container the server must listen beyond loopback. Settings are read from the
# environment, so `docker run -e FLOODGATE_BACKEND=redis …` or the chart can change any.
ENV FLOODGATE_GRPC_ADDR=0.0.0.0:8081 \
    FLOODGATE_HTTP_ADDR=0.0.0.0:8080 \
    FLOODGATE_RULES=/etc/floodgate/rules
# Any non-root user will do: floodgate writes nothing, so a read-only root filesystem works.
USER 10001:10001
EXPOSE 8081 8080
ENTRYPOINT ["/usr/local/bin/floodgate"]
CMD ["serve"]
