//! The generated Envoy RLS v3 types, tonic service and protobuf-JSON mapping.
//!
//! The module tree mirrors the protobuf packages so the generated code's cross-package paths
//! (`super::super::...`) resolve.

#![allow(clippy::all, missing_docs)]

pub mod envoy {
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
                include!(concat!(env!("OUT_DIR"), "/envoy.config.core.v3.serde.rs"));
            }
        }
    }
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/envoy.extensions.common.ratelimit.v3.serde.rs"
                    ));
                }
            }
        }
    }
    pub mod r#type {
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
            include!(concat!(env!("OUT_DIR"), "/envoy.r#type.v3.serde.rs"));
        }
    }
    pub mod service {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
                include!(concat!(
                    env!("OUT_DIR"),
                    "/envoy.service.ratelimit.v3.serde.rs"
                ));
            }
        }
    }
}

/// The encoded descriptor set of our protos, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/floodgate_descriptor.bin"));
