//! The generated Envoy RLS v3 types, tonic service and protobuf-JSON mapping; and the xDS
//! messages, service and resource that deliver rules over ADS.
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
        pub mod discovery {
            pub mod v3 {
                tonic::include_proto!("envoy.service.discovery.v3");
            }
        }
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
                include!(concat!(
                    env!("OUT_DIR"),
                    "/envoy.service.ratelimit.v3.serde.rs"
                ));
            }
        }
        pub mod rate_limit_quota {
            pub mod v3 {
                tonic::include_proto!("envoy.service.rate_limit_quota.v3");
                include!(concat!(
                    env!("OUT_DIR"),
                    "/envoy.service.rate_limit_quota.v3.serde.rs"
                ));
            }
        }
    }
}

/// `google.rpc.Status`: why an xDS client refused a configuration.
pub mod google {
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

/// floodgate's admin API over gRPC (`src/edge/admin.rs`).
pub mod floodgate {
    pub mod admin {
        pub mod v1 {
            tonic::include_proto!("floodgate.admin.v1");
        }
    }
}

/// envoyproxy/ratelimit's rule configuration as an xDS resource.
pub mod ratelimit {
    pub mod config {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("ratelimit.config.ratelimit.v3");
            }
        }
    }
}

/// The encoded descriptor set of our protos, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/floodgate_descriptor.bin"));
