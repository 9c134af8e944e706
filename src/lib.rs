//! floodgate: a gRPC rate-limit decision service, wire-compatible with Envoy's
//! `envoy.service.ratelimit.v3.RateLimitService`.
//!
//! The request path, one module per step: [`proto`] (the wire) → [`rules`] (domain and
//! descriptor matching) → [`limiter`] (counter keys and algorithms) → [`backend`] (where the
//! counters live) → [`service`] (combining the decisions into the response).
//!
//! The modules depend one way (docs/development.md, "Layout", draws it;
//! `tests/module_graph.rs` keeps it): counts are kept where they happen, with [`instruments`], and read by [`metrics`].

/// The server's version and the commit it was built from, as `floodgate --version` prints
/// them and `floodgate_build_info` labels them.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const COMMIT: &str = env!("FLOODGATE_COMMIT");
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("FLOODGATE_COMMIT"),
    ")"
);

pub mod backend;
pub mod clock;
pub mod counters;
pub mod edge;
pub mod files;
pub mod instruments;
pub mod limiter;
pub mod metrics;
pub mod proto;
pub mod quota;
pub mod reload;
pub mod rules;
pub mod server;
pub mod service;
pub mod settings;
pub mod telemetry;
pub mod xds;
