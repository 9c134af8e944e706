//! A hit sent alone to a Redis Cluster, by its slot, following the cluster's redirects until it
//! runs exactly once: the way a hit goes when its primary's lane could not take it (the slot
//! map is stale or does not know the slot).
//!
//! **Redirects are followed here, exactly once per call.** The call declares its keys, so the
//! cluster answers a redirect before anything runs, and a redirect means the call did not
//! run: the call alone is sent again, to the node an ASK names, preceded by ASKING in the
//! same pipeline (the redis crate sends ASKING as a request of its own on the node's shared
//! connection, where another request's command can use it up first, and the call then
//! bounces between the two nodes); to the node a MOVED names; after a short pause for
//! TRYAGAIN, CLUSTERDOWN and the like. A connection error is not resent: the call may have
//! run. The crate's own retries are therefore off; it still refreshes its slot map and
//! reconnects by itself.

use std::time::Duration;

use deadpool_redis::redis;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use crate::backend::BackendError;
use crate::limiter::Decision;

use super::script::{self, RedisHit, ScriptClock};
use super::{Scripts, is_noscript, load_scripts, unavailable};

/// The first pause before resending a call the cluster could not take yet (TRYAGAIN,
/// CLUSTERDOWN, a node being reconnected); it doubles up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(5);
pub(super) const LONGEST_PAUSE: Duration = Duration::from_millis(100);

/// One call of `hit`, to be run by `deadline` (its server's clock, µs) or not at all, sent
/// again after each redirect until it runs (a redirect means it did not) and again once after
/// a NOSCRIPT, with the scripts loaded. The caller's deadline ends the loop.
pub(super) async fn run_call(
    mut connection: ClusterConnection,
    scripts: &Scripts,
    hit: &RedisHit,
    deadline: Option<u64>,
    local_now: u64,
) -> Result<Decision, BackendError> {
    let mut target = None;
    let mut pause = FIRST_PAUSE;
    let mut reloaded = false;
    loop {
        let call = Call {
            hit,
            deadline,
            local_now,
        };
        match send(&mut connection, scripts, &call, target.as_ref()).await {
            Ok(reply) if is_noscript(&reply) && !reloaded => {
                tracing::info!("a redis cluster node lost its scripts; loading them again");
                load_scripts(&mut connection, scripts).await?;
                reloaded = true;
            }
            Ok(reply) => match script::decision(&reply) {
                // The key the script read first is not served here (its slot is moving
                // and the key moved, or the cluster is failing over): nothing ran.
                Err(BackendError::Unavailable(message)) if not_served_here(&message) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(LONGEST_PAUSE);
                    target = None;
                }
                result => return result,
            },
            Err(error) => match Resend::after(&error) {
                Some(Resend::Later) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(LONGEST_PAUSE);
                    target = None;
                }
                Some(resend) => target = Some(resend),
                None => return Err(unavailable(error)),
            },
        }
    }
}

/// One hit's call: the deadline past which it decides nothing (its server's clock), and the
/// local clock for calendar windows.
struct Call<'a> {
    hit: &'a RedisHit,
    deadline: Option<u64>,
    local_now: u64,
}

/// Sends one call: routed by its key, or to the node a redirect named.
async fn send(
    connection: &mut ClusterConnection,
    scripts: &Scripts,
    call: &Call<'_>,
    target: Option<&Resend>,
) -> RedisResult<Value> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    if let Some(Resend::Asking(_)) = target {
        pipe.cmd("ASKING");
    }
    script::add_call(
        &mut pipe,
        scripts,
        call.hit,
        ScriptClock::Redis,
        call.deadline,
        call.local_now,
    );
    let replies: Vec<Value> = match target {
        Some(Resend::Asking(node) | Resend::To(node)) => {
            let count = pipe.len();
            connection
                .route_pipeline(pipe, 0, count, node.clone())
                .await?
        }
        Some(Resend::Later) | None => pipe.query_async(connection).await?,
    };
    // The script's reply is the last one (after ASKING's OK).
    replies
        .into_iter()
        .next_back()
        .ok_or_else(|| RedisError::from((ErrorKind::Client, "no reply to a script call")))
}

/// Whether a hit's error says the node does not serve its key now: a script that touches a
/// key the cluster has moved away (or cannot serve while it is down) fails on that key's
/// first read, before it wrote anything, so the hit can be sent again.
pub(super) fn not_served_here(message: &str) -> bool {
    message.contains("non local key") || message.contains("cluster is down")
}

/// Where to send a call again.
#[derive(Debug, Clone, PartialEq)]
enum Resend {
    /// To this node, preceded by ASKING: the slot is moving there and the key has moved.
    Asking(SingleNodeRoutingInfo),
    /// To this node, which owns the slot now.
    To(SingleNodeRoutingInfo),
    /// Wherever the slot map says, after a pause: the cluster cannot take it yet.
    Later,
}

impl Resend {
    /// How to resend after `error`; `None` when the call may have run (a connection error)
    /// or will never run (any other error).
    fn after(error: &RedisError) -> Option<Resend> {
        let node = || {
            let (address, _slot) = error.redirect_node()?;
            let (host, port) = address.rsplit_once(':')?;
            let port = port.parse().ok()?;
            Some(SingleNodeRoutingInfo::ByAddress {
                host: host.to_owned(),
                port,
            })
        };
        match error.kind() {
            ErrorKind::Server(ServerErrorKind::Ask) => node().map(Resend::Asking),
            ErrorKind::Server(ServerErrorKind::Moved) => {
                Some(node().map_or(Resend::Later, Resend::To))
            }
            ErrorKind::Server(
                ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::BusyLoading
                | ServerErrorKind::ReadOnly,
            )
            | ErrorKind::ClusterConnectionNotFound => Some(Resend::Later),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error the cluster connection reports for a server's error reply `reply`.
    fn server_error(reply: &str) -> RedisError {
        redis::parse_redis_value(format!("-{reply}\r\n").as_bytes())
            .and_then(Value::extract_error)
            .expect_err("an error reply")
    }

    fn node(host: &str, port: u16) -> SingleNodeRoutingInfo {
        SingleNodeRoutingInfo::ByAddress {
            host: host.into(),
            port,
        }
    }

    #[test]
    fn a_call_is_resent_after_a_redirect_to_the_node_it_names() {
        assert_eq!(
            Resend::after(&server_error("ASK 3137 127.0.0.1:7002")),
            Some(Resend::Asking(node("127.0.0.1", 7002)))
        );
        assert_eq!(
            Resend::after(&server_error("MOVED 3137 10.0.0.5:7001")),
            Some(Resend::To(node("10.0.0.5", 7001)))
        );
    }

    #[test]
    fn a_call_the_cluster_could_not_take_yet_is_resent_later() {
        for reply in [
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
            "MASTERDOWN Link with MASTER is down",
            "LOADING Redis is loading the dataset in memory",
            "READONLY You can't write against a read only replica.",
        ] {
            assert_eq!(
                Resend::after(&server_error(reply)),
                Some(Resend::Later),
                "{reply}"
            );
        }
    }

    #[test]
    fn a_call_that_may_have_run_or_never_will_is_not_resent() {
        let dropped = RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert_eq!(Resend::after(&dropped), None);
        assert_eq!(Resend::after(&server_error("ERR unknown command")), None);
        assert_eq!(
            Resend::after(&server_error("NOSCRIPT No matching script")),
            None
        );
    }
}
