//! What one client may ask (`request_limits`) and hold open (`connection_limits`).

use serde::Deserialize;

/// Bounds on a request, so no client can make one decision arbitrarily expensive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RequestLimits {
    pub max_descriptors: usize,
    pub max_entries: usize,
    pub max_key_bytes: usize,
    pub max_value_bytes: usize,
}

impl RequestLimits {
    /// The encoded size of the largest request these limits let through: every descriptor
    /// and entry there may be, each key and value as long as it may be, the domain as long
    /// as a value, and every number at its widest. A gRPC message larger than this cannot be
    /// valid.
    pub fn largest_request_bytes(&self) -> usize {
        use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
        use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
            Entry, RateLimitOverride,
        };
        use crate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
        use prost::Message;
        let entry = Entry {
            key: "k".repeat(self.max_key_bytes),
            value: "v".repeat(self.max_value_bytes),
        };
        let descriptor = RateLimitDescriptor {
            entries: vec![entry; self.max_entries],
            limit: Some(RateLimitOverride {
                requests_per_unit: u32::MAX,
                // A negative enum value is ten bytes on the wire, the most an enum takes.
                unit: -1,
                unit_multiplier: Some(pbjson_types::UInt32Value { value: u32::MAX }),
            }),
            hits_addend: Some(pbjson_types::UInt64Value { value: u64::MAX }),
            is_negative_hits: true,
        };
        let request = RateLimitRequest {
            domain: "d".repeat(self.max_value_bytes),
            descriptors: vec![descriptor; self.max_descriptors],
            hits_addend: u32::MAX,
        };
        request.encoded_len()
    }
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_descriptors: 64,
            max_entries: 16,
            max_key_bytes: 256,
            max_value_bytes: 1024,
        }
    }
}

/// The default of `connection_limits.max_request_bytes_held`.
pub const DEFAULT_MAX_REQUEST_BYTES_HELD: usize = 32 << 20;

/// Bounds on a client connection, on both ports, so no client can hold one (a file
/// descriptor, and the memory of its streams) without using it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConnectionLimits {
    /// A new connection must send its first 24 bytes (an HTTP/2 preface) within this, and an
    /// HTTP/1 request its headers.
    pub handshake_timeout_ms: u64,
    /// A connection that sends nothing for this long is closed. Idle HTTP/2 peers are
    /// pinged every `keepalive_interval_ms`, so only a dead or silent one reaches it.
    pub idle_timeout_ms: u64,
    /// HTTP/2 pings on a connection with nothing to read; a ping unanswered for as long
    /// closes it.
    pub keepalive_interval_ms: u64,
    /// The most one request may take, its body included (HTTP: 408; gRPC: CANCELLED, or
    /// DEADLINE_EXCEEDED when the caller's `grpc-timeout` is the sooner).
    pub request_timeout_ms: u64,
    /// Streams (requests in flight) one HTTP/2 connection may have open; clients open more
    /// connections beyond it (Envoy's connection pool does).
    pub max_concurrent_streams: u32,
    /// gRPC: a connection this old (±10%) is asked to go (HTTP/2 GOAWAY), so that clients
    /// spread over replicas added since they connected; 0: never.
    pub max_connection_age_ms: u64,
    /// gRPC: after `max_connection_age_ms`, how long its requests in flight get before the
    /// connection is closed; 0: until they finish (each is bounded by `request_timeout_ms`).
    pub max_connection_age_grace_ms: u64,
    /// gRPC: the most bytes calls waiting for the rest of their request may hold together,
    /// across connections (their headers, stream state and body so far); a call that would
    /// pass it is refused with RESOURCE_EXHAUSTED (`grpc_body.rs`).
    pub max_request_bytes_held: usize,
    /// Connections each port holds at most; at that many, new ones wait in the listen queue
    /// until some close (silent ones are closed to make room).
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            handshake_timeout_ms: 10_000,
            idle_timeout_ms: 300_000,
            keepalive_interval_ms: 30_000,
            request_timeout_ms: 10_000,
            max_concurrent_streams: 1024,
            max_connection_age_ms: 0,
            max_connection_age_grace_ms: 0,
            max_request_bytes_held: DEFAULT_MAX_REQUEST_BYTES_HELD,
            max_connections: 1024,
        }
    }
}
