//! Generates the Envoy RLS v3 messages (prost) and the tonic client from the server's own
//! proto files in `../../proto`, so client and server can never disagree on the wire. protoc
//! comes from the `protoc-bin-vendored` crate: a build needs no system protobuf compiler.

use std::path::PathBuf;

const PROTO_ROOT: &str = "../../proto";
const SERVICE_PROTO: &str = "envoy/service/ratelimit/v3/rls.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = PathBuf::from(PROTO_ROOT);
    let mut prost_config = tonic_prost_build::Config::new();
    prost_config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_with_config(
            prost_config,
            &[proto_root.join(SERVICE_PROTO)],
            &[proto_root.clone(), protoc_bin_vendored::include_path()?],
        )?;

    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    Ok(())
}
