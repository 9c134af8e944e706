//! A client for floodgate, the gRPC rate-limit service wire-compatible with Envoy's
//! `envoy.service.ratelimit.v3.RateLimitService` (it works with any server of that contract).
//!
//! [`Client`] asks for a [`Decision`] and never leaves the caller waiting longer than its one
//! timeout, retries included: when the server cannot answer, the client's [`FailureMode`]
//! decides, and the decision says it was [`degraded`](Decision::degraded). It retries only
//! what cannot count twice unless told otherwise; the Python and TypeScript clients behave
//! the same (the repository's `docs/clients.md`). [`RateLimitLayer`] puts the same
//! client in front of any tower HTTP service (axum, tonic, hyper).
//!
//! ```no_run
//! # async fn example() -> Result<(), floodgate_client::Error> {
//! use floodgate_client::{Client, Descriptor};
//!
//! let client = Client::connect("http://127.0.0.1:8081").await?;
//! let user = Descriptor::new().entry("user_id", "alice");
//! let decision = client.should_rate_limit("api", &[user], 1).await?;
//! if !decision.allowed {
//!     println!("slow down: {:?}", decision.statuses[0].reset);
//! }
//! # Ok(())
//! # }
//! ```

mod client;
mod decision;
mod descriptor;
mod error;
mod failure;
mod layer;
mod retry;

pub mod proto;

pub use client::Client;
pub use decision::{Decision, DescriptorStatus, FailureMode, Limit, Unit};
pub use descriptor::Descriptor;
pub use error::Error;
pub use layer::{RateLimitLayer, RateLimitService};
pub use retry::Retry;
