//! The front door: everything between a client's bytes and the decision. Each listener
//! (`socket`: a TCP port or a Unix socket) accepts connections and guards them (`listener`:
//! the handshake and idle timeouts, the descriptor and connection limits), under TLS when
//! asked (`tls`). The gRPC port's connections are served by hyper's HTTP/2 under tonic's
//! routes (`grpc_conn`, with `unix_authority` mending a C-core client's authority on a
//! Unix socket), where `grpc` adapts ShouldRateLimit to the decision (its deadline, its
//! codes; `codec` answers an undecodable request INVALID_ARGUMENT) and `rlqs` RLQS' streams
//! to `quota`'s, every body read within `grpc_body`'s limits; the HTTP port serves health, `/json`, `/rlconfig` and `/metrics` (`http`,
//! its JSON bodies read by `json_body`), and the admin API its own port (`admin`). What a
//! request becomes from there is `service`'s (the decision) and `quota`'s (RLQS).

pub mod admin;
pub mod codec;
pub mod grpc;
pub mod grpc_body;
pub mod grpc_conn;
pub mod http;
pub mod json_body;
pub mod listener;
pub mod rlqs;
pub mod socket;
pub mod tls;
pub mod unix_authority;
