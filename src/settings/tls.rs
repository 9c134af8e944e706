//! TLS on a listener (`grpc_tls`, `admin_tls`): its files and how often they are read again.

use std::path::PathBuf;

use serde::Deserialize;

/// TLS on a listener (the gRPC port's `grpc_tls`, the admin API's `admin_tls`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListenerTls {
    /// PEM certificate chain and private key: with both set, the listener serves TLS only.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// PEM CA certificates: set, clients must present a certificate that chains to one
    /// (mutual TLS).
    pub client_ca_file: Option<PathBuf>,
    /// How often the files are read again for a rotated certificate; 0: never.
    pub reload_interval_ms: u64,
}

impl Default for ListenerTls {
    fn default() -> Self {
        ListenerTls {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            reload_interval_ms: 10_000,
        }
    }
}
