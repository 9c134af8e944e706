//! Generates the Envoy RLS v3 messages (prost) and the tonic client from the crate's own
//! `proto/` folder: byte-for-byte copies of the server's files in the repository's `proto/`
//! (tests/packaging fails when they drift), kept inside the crate so the published package
//! builds on its own. protoc comes from the `protoc-bin-vendored` crate: a build needs no
//! system protobuf compiler.

use std::path::Path;

const PROTO_ROOT: &str = "proto";
const SERVICE_PROTO: &str = "envoy/service/ratelimit/v3/rls.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = Path::new(PROTO_ROOT);
    let mut prost_config = tonic_prost_build::Config::new();
    prost_config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_with_config(
            prost_config,
            &[proto_root.join(SERVICE_PROTO)],
            &[
                proto_root.to_path_buf(),
                protoc_bin_vendored::include_path()?,
            ],
        )?;

    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    Ok(())
}
