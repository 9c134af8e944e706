//! The `xds` settings: rules from an xDS management server.

use std::path::PathBuf;

use serde::Deserialize;

/// The xDS management server that delivers the rules when `rules_source` is `xds`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct XdsSettings {
    /// `http://host:port`, or `https://host:port` for TLS.
    pub server_url: String,
    /// The node this replica subscribes as (the server may send each node its own rules).
    pub node_id: String,
    pub node_cluster: String,
    /// PEM CA certificates the server's certificate must chain to (https); the system's
    /// roots when unset.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for a server that requires them (mutual TLS).
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The name the server's certificate must carry, when not the URL's host.
    pub server_name: Option<String>,
    /// Serve at once with no rules until the first snapshot arrives, instead of waiting
    /// for it before opening the listeners.
    pub start_without_initial_config: bool,
    /// Pauses between reconnections: from this, doubling (jittered) up to `retry_max_ms`.
    pub retry_initial_ms: u64,
    pub retry_max_ms: u64,
    /// A TOML file of overlays: floodgate's extensions (algorithm, burst, ...) for rules
    /// the server delivers, by domain and descriptor path (`src/xds/overlay.rs`).
    pub overlays_file: Option<PathBuf>,
    /// The largest message the xDS server may send (upstream's
    /// `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`); a larger one fails the stream.
    pub max_message_bytes: usize,
}

impl Default for XdsSettings {
    fn default() -> Self {
        XdsSettings {
            server_url: "http://127.0.0.1:18000".into(),
            node_id: "floodgate".into(),
            node_cluster: "floodgate".into(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            server_name: None,
            start_without_initial_config: false,
            retry_initial_ms: 500,
            retry_max_ms: 30_000,
            overlays_file: None,
            max_message_bytes: DEFAULT_XDS_MAX_MESSAGE_BYTES,
        }
    }
}

/// The default of `xds.max_message_bytes`: gRPC's customary 4 MiB, what Envoy's and
/// envoyproxy/ratelimit's xDS clients accept too.
pub const DEFAULT_XDS_MAX_MESSAGE_BYTES: usize = 4 << 20;
