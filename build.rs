//! Generates the Envoy RLS v3 messages (prost), the tonic server and client, the
//! protobuf-JSON mapping (pbjson) used by `POST /json`, and the descriptor set served by
//! gRPC reflection. protoc comes from the `protoc-bin-vendored` crate, so a build needs no
//! system protobuf compiler.

use std::path::{Path, PathBuf};
use std::process::Command;

const SERVICE_PROTO: &str = "proto/envoy/service/ratelimit/v3/rls.proto";
/// Envoy's Rate Limit Quota Service, served beside it (and so in the reflection's set).
const QUOTA_PROTO: &str = "proto/envoy/service/rate_limit_quota/v3/rlqs.proto";
/// Rules over xDS: the Aggregated Discovery Service (floodgate is its client; the tests run
/// a server) and envoyproxy/ratelimit's RateLimitConfig resource.
const XDS_PROTOS: [&str; 3] = [
    "proto/envoy/service/discovery/v3/ads.proto",
    "proto/ratelimit/config/ratelimit/v3/rls_conf.proto",
    // And floodgate's own admin service, which prost's codec serves too.
    "proto/floodgate/admin/v1/admin.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out_dir.join("floodgate_descriptor.bin");
    let well_known = protoc_bin_vendored::include_path()?;

    let mut prost_config = tonic_prost_build::Config::new();
    prost_config
        .protoc_executable(protoc_bin_vendored::protoc_bin_path()?)
        .file_descriptor_set_path(&descriptor_path)
        .compile_well_known_types()
        .extern_path(".google.protobuf", "::pbjson_types")
        // A descriptor's entry is the library's one descriptor type (`rules::Entry`): RLQS
        // buckets are keyed and sorted by their entries.
        .type_attribute(
            ".envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry",
            "#[derive(PartialOrd, Ord)]",
        );

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // prost's codec, but an undecodable request is INVALID_ARGUMENT, not INTERNAL.
        .codec_path("crate::edge::codec::Codec")
        .compile_with_config(
            prost_config,
            &[PathBuf::from(SERVICE_PROTO), PathBuf::from(QUOTA_PROTO)],
            &[PathBuf::from("proto"), well_known.clone()],
        )?;

    // prost's own codec here: an xDS message that does not decode is not a caller's
    // rate-limit request.
    let mut xds_config = tonic_prost_build::Config::new();
    xds_config
        .protoc_executable(protoc_bin_vendored::protoc_bin_path()?)
        .compile_well_known_types()
        .extern_path(".google.protobuf", "::pbjson_types");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_with_config(
            xds_config,
            &XDS_PROTOS.map(PathBuf::from),
            &[PathBuf::from("proto"), well_known],
        )?;

    let descriptors = std::fs::read(&descriptor_path)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        .build(&[".envoy"])?;

    println!("cargo:rerun-if-changed=proto");
    announce_commit();
    Ok(())
}

/// Sets `FLOODGATE_COMMIT`, the commit `floodgate --version` and `floodgate_build_info` name:
/// the variable's own value when the build sets it (the image builds without `.git`), else
/// git's HEAD, else `unknown`. Reruns when HEAD moves.
fn announce_commit() {
    println!("cargo:rerun-if-env-changed=FLOODGATE_COMMIT");
    let git = Path::new(".git");
    if git.is_dir() {
        println!("cargo:rerun-if-changed=.git/HEAD");
        let head = std::fs::read_to_string(git.join("HEAD")).unwrap_or_default();
        if let Some(branch) = head.trim().strip_prefix("ref: ") {
            println!("cargo:rerun-if-changed=.git/{branch}");
        }
        if git.join("packed-refs").exists() {
            println!("cargo:rerun-if-changed=.git/packed-refs");
        }
    }
    let commit = std::env::var("FLOODGATE_COMMIT")
        .ok()
        .filter(|commit| !commit.is_empty())
        .or_else(|| {
            let output = Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()?;
            let commit = String::from_utf8(output.stdout).ok()?;
            (output.status.success() && !commit.trim().is_empty()).then(|| commit.trim().into())
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=FLOODGATE_COMMIT={commit}");
}
