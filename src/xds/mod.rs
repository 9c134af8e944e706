//! Rules over xDS: floodgate as the client of a management server's Aggregated Discovery
//! Service (State of the World), subscribed to envoyproxy/ratelimit's `RateLimitConfig`
//! resources, as Envoy Gateway and Envoy AI Gateway deliver them.
//!
//! **Each snapshot is a rule set.** A response carries every `RateLimitConfig` the server
//! has for this node; each becomes the rule file it describes (`convert.rs`) and the whole
//! snapshot goes through the loader that rule files go through, with the same checks and
//! the same bounds (`rules_max_bytes`, nesting). It takes effect with one atomic swap and is
//! ACKed (the request carries the snapshot's version and nonce), or it is NACKed (the
//! version still in force, the nonce, and the loader's errors in `error_detail`) and the
//! rules in force stay.
//!
//! **A snapshot is bounded before it is expanded** (`bound.rs`): its message by size, its
//! descriptors by count before they are decoded, its rule text as it is written; a snapshot
//! past `rules_max_bytes` is NACKed saying how far it got.
//!
//! **The stream is kept.** A connection that fails, or a stream the server ends, is opened
//! again after a pause that starts at `retry_initial_ms`, doubles up to `retry_max_ms` and
//! is jittered, so replicas do not return in step; a stream that delivered a snapshot
//! resets it. HTTP/2 keep-alive pings notice a server that went away without a word. The
//! subscription names the version in force, so a restarted server knows what this replica
//! runs.
//!
//! **Overlays** (`overlay.rs`, `xds.overlays_file`) give delivered rules floodgate's
//! extensions (algorithm, burst, unit multiplier, time zone, failure policy), merged in
//! before the load; the file is read again at every snapshot, on tokio's blocking pool, as
//! [`crate::files`] reads every file (a regular file, at most `rules_max_bytes`). One that
//! does not read then is logged and the overlays in force stay.
//!
//! **Start-up** waits for the first accepted snapshot before the listeners open, unless
//! `start_without_initial_config` is set: then floodgate serves at once with no rules (every
//! request OK, nothing counted) until one arrives.

mod bound;
mod connect;
pub mod convert;
pub mod overlay;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::proto::envoy::config::core::v3::{Node, node::UserAgentVersionType};
use crate::proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use crate::proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use crate::proto::google::rpc::Status;
use crate::proto::ratelimit::config::ratelimit::v3::RateLimitConfig;
use crate::rules::{LoadErrors, Origin, RuleSet};
use crate::service::RateLimiter;
use crate::settings::XdsSettings;
use bound::ItemCount;
use overlay::Overlays;

pub use connect::XdsError;

/// The resource floodgate subscribes to: envoyproxy/ratelimit's rule configuration.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// gRPC's INVALID_ARGUMENT, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// A subscription to the rules an xDS server holds for this node.
pub struct Subscription {
    settings: XdsSettings,
    /// `rules_max_bytes`: the most the snapshot's rule files may hold together.
    max_bytes: u64,
    limiter: Arc<RateLimiter>,
    /// The version of the snapshot in force, once one was accepted.
    accepted: Option<String>,
    /// Told each time a snapshot is accepted (start-up waits for the first).
    applied: watch::Sender<u64>,
    /// The operator's extensions for the delivered rules (`xds.overlays_file`), as last read.
    overlays: Overlays,
}

/// Resolves once the subscription has put a snapshot in force.
pub struct FirstSnapshot(watch::Receiver<u64>);

impl FirstSnapshot {
    /// Waits for the first accepted snapshot; `false` if the subscription ended first.
    pub async fn arrived(mut self) -> bool {
        self.0.wait_for(|applied| *applied > 0).await.is_ok()
    }
}

impl Subscription {
    /// A subscription that puts each snapshot it accepts in force on `limiter`; an error
    /// when the overlays file cannot be read.
    pub fn new(
        settings: XdsSettings,
        max_bytes: u64,
        limiter: Arc<RateLimiter>,
    ) -> Result<Self, String> {
        let overlays = match &settings.overlays_file {
            Some(path) => Overlays::read(path, max_bytes)?,
            None => Overlays::default(),
        };
        Ok(Subscription {
            settings,
            max_bytes,
            limiter,
            accepted: None,
            applied: watch::channel(0).0,
            overlays,
        })
    }

    /// Reads the overlays file again, so that an edit applies from the next snapshot; a
    /// file that no longer reads is logged and the overlays in force stay.
    async fn refresh_overlays(&mut self) {
        let Some(path) = &self.settings.overlays_file else {
            return;
        };
        match Overlays::read_off_runtime(path, self.max_bytes).await {
            Ok(overlays) => self.overlays = overlays,
            Err(error) => tracing::error!("xDS overlays not reread, the last ones stay: {error}"),
        }
    }

    /// Runs in the background for as long as the process does.
    pub fn spawn(mut self) -> (JoinHandle<()>, FirstSnapshot) {
        let first = FirstSnapshot(self.applied.subscribe());
        let task = tokio::spawn(async move { self.run().await });
        (task, first)
    }

    async fn run(&mut self) {
        let initial = Duration::from_millis(self.settings.retry_initial_ms.max(1));
        let longest = Duration::from_millis(self.settings.retry_max_ms).max(initial);
        let mut pause = initial;
        loop {
            let mut delivered = false;
            let outcome = self.session(&mut delivered).await;
            let server = &self.settings.server_url;
            match outcome {
                Ok(()) => tracing::info!(%server, "the xDS stream ended; subscribing again"),
                Err(error) => tracing::warn!(%server, %error, "xDS subscription failed"),
            }
            // A stream that worked for a while starts the pauses over.
            if delivered {
                pause = initial;
            }
            // Half the pause, and up to as much again at random: replicas spread out.
            let jitter = pause.mul_f64(fastrand::f64()) / 2;
            tokio::time::sleep(pause / 2 + jitter).await;
            pause = (pause * 2).min(longest);
        }
    }

    /// One stream: subscribes, then applies each snapshot and answers it, until the stream
    /// ends; `delivered` tells whether it brought a snapshot, whichever way it ended.
    async fn session(&mut self, delivered: &mut bool) -> Result<(), XdsError> {
        let channel = connect::endpoint(&self.settings).await?.connect().await?;
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(self.settings.max_message_bytes);
        let (requests, outgoing) = mpsc::channel(4);
        let outgoing = futures_util::stream::unfold(outgoing, |mut outgoing| async move {
            outgoing.recv().await.map(|request| (request, outgoing))
        });
        // Queued before the call so that it opens the stream (4 fit; nothing else is queued).
        let _ = requests.try_send(self.request(String::new(), None));
        let mut responses = client
            .stream_aggregated_resources(outgoing)
            .await?
            .into_inner();
        tracing::info!(server = %self.settings.server_url, "subscribed to xDS rules");
        while let Some(response) = responses.message().await? {
            *delivered = true;
            let answer = self.answer(&response).await;
            if requests.send(answer).await.is_err() {
                break;
            }
        }
        Ok(())
    }

    /// Applies `response` and says so: its ACK, or its NACK with the reason.
    async fn answer(&mut self, response: &DiscoveryResponse) -> DiscoveryRequest {
        self.refresh_overlays().await;
        let version = &response.version_info;
        match self.apply(response) {
            Ok(()) => {
                tracing::info!(version, "xDS rules in force");
                self.accepted = Some(version.clone());
                self.applied.send_modify(|count| *count += 1);
                self.request(response.nonce.clone(), None)
            }
            Err(error) => {
                tracing::error!(
                    version,
                    "xDS rules refused, the rules in force stay: {error}"
                );
                let status = Status {
                    code: INVALID_ARGUMENT,
                    message: error,
                    details: Vec::new(),
                };
                self.request(response.nonce.clone(), Some(status))
            }
        }
    }

    /// Loads every configuration of `response` as one rule set and puts it in force.
    fn apply(&self, response: &DiscoveryResponse) -> Result<(), String> {
        let loads = self.limiter.metrics().config_loads();
        let loaded = self.load(response);
        loads.record(loaded.is_ok());
        self.limiter.replace_rules(loaded?);
        Ok(())
    }

    /// The rule set `response` describes. Each bound is checked before the step that would
    /// expand past it (`bound.rs`): the items of a configuration before it is decoded, its
    /// rule text as it is written.
    fn load(&self, response: &DiscoveryResponse) -> Result<RuleSet, String> {
        if response.type_url != TYPE_URL {
            return Err(format!(
                "a response of type {}, not {TYPE_URL}",
                response.type_url
            ));
        }
        let resources = response.resources.len();
        let mut items = ItemCount::new(self.max_bytes);
        let max_bytes = usize::try_from(self.max_bytes).unwrap_or(usize::MAX);
        let mut written = 0;
        let mut names = HashSet::new();
        let mut sources: Vec<(String, String)> = Vec::new();
        for (index, resource) in response.resources.iter().enumerate() {
            if resource.type_url != TYPE_URL {
                return Err(format!(
                    "resource {index} is a {}, not a {TYPE_URL}",
                    resource.type_url
                ));
            }
            items
                .count(index, &resource.value)
                .map_err(|error| error.to_string())?;
            let config = RateLimitConfig::decode(&resource.value[..])
                .map_err(|error| format!("resource {index} does not decode: {error}"))?;
            let room = max_bytes.saturating_sub(written);
            let source = convert::rule_source(&config, &self.overlays, room).map_err(|_| {
                format!(
                    "the snapshot's rules pass rules_max_bytes ({max_bytes}) as rule files: \
                     {written} bytes before resource {index} of {resources} ({:?}), which does \
                     not fit in the {room} left; raise the setting or send fewer rules",
                    config.name
                )
            })?;
            if !names.insert(source.name.clone()) {
                return Err(format!("two configurations are named {:?}", config.name));
            }
            for unused in &source.unused_overlays {
                tracing::warn!("{unused}");
            }
            written += source.text.len();
            sources.push((source.name, source.text));
        }
        let mut rules = RuleSet::from_sources(&sources).map_err(|errors| nack_message(&errors))?;
        rules.origin = Origin::Xds {
            server: self.settings.server_url.clone(),
            version: response.version_info.clone(),
        };
        Ok(rules)
    }

    /// A request of this subscription: the version in force, `nonce` of the response it
    /// answers (empty to subscribe) and, for a NACK, why.
    fn request(&self, nonce: String, error_detail: Option<Status>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: self.accepted.clone().unwrap_or_default(),
            node: Some(Node {
                id: self.settings.node_id.clone(),
                cluster: self.settings.node_cluster.clone(),
                user_agent_name: "floodgate".into(),
                user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
                    env!("CARGO_PKG_VERSION").into(),
                )),
            }),
            resource_names: Vec::new(),
            type_url: TYPE_URL.into(),
            response_nonce: nonce,
            error_detail,
        }
    }
}

/// The most of a NACK's message: the loader's first errors, enough to act on, and far inside
/// what a management server takes in one message (the log line says the same).
const NACK_MESSAGE_MAX_BYTES: usize = 16 * 1024;

/// `errors`, one a line, as many as fit in [`NACK_MESSAGE_MAX_BYTES`], then how many more.
fn nack_message(errors: &LoadErrors) -> String {
    let mut message = String::new();
    for (shown, error) in errors.0.iter().enumerate() {
        let line = error.to_string();
        let room = NACK_MESSAGE_MAX_BYTES.saturating_sub(message.len());
        if line.len() > room && shown > 0 {
            let more = errors.0.len() - shown;
            message.push_str(&format!("\n… and {more} more errors"));
            break;
        }
        if shown > 0 {
            message.push('\n');
        }
        // The first error alone is cut short if it must be (a value the size of a message).
        let mut end = line.len().min(room.max(1));
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        message.push_str(&line[..end]);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::LoadError;

    fn errors(count: usize, message: &str) -> LoadErrors {
        let error = LoadError {
            file: "xds:n".into(),
            line: 3,
            rule: "domain d > k".into(),
            message: message.into(),
        };
        LoadErrors(vec![error; count])
    }

    #[test]
    fn a_nack_names_the_first_errors_and_counts_the_rest() {
        let message = nack_message(&errors(10_000, "no unit"));
        assert!(
            message.len() <= NACK_MESSAGE_MAX_BYTES + 64,
            "{}",
            message.len()
        );
        assert!(
            message.starts_with("xds:n:3: domain d > k: no unit\n"),
            "{message}"
        );
        assert!(message.ends_with(" more errors"), "{message}");
        assert_eq!(
            nack_message(&errors(2, "no unit")),
            errors(2, "no unit").to_string()
        );
    }

    #[test]
    fn a_first_error_larger_than_a_nack_is_cut_short() {
        let message = nack_message(&errors(1, &"é".repeat(NACK_MESSAGE_MAX_BYTES)));
        assert!(message.len() <= NACK_MESSAGE_MAX_BYTES, "{}", message.len());
    }
}
