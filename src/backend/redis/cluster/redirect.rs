//! A hit sent alone to a Redis Cluster, by its slot, following the cluster's redirects until it
//! runs exactly once: the way a hit goes when its primary's lane could not take it (the slot
//! map is stale or does not know the slot).
//!
//! **Redirects are followed here, exactly once per call.** The call declares its keys, so the
//! cluster answers a redirect before anything runs, and a redirect means the call did not
//! run: the call alone is sent again, to the node an ASK names, preceded by ASKING in the
//! same pipeline (sent as a request of its own on the node's shared connection, another
//! request's command could use it up first, and the call would then bounce between the two
//! nodes); to the node a MOVED names; after a short pause for TRYAGAIN, CLUSTERDOWN and the
//! like, by the slot map read again. A connection error is not resent: the call may have run.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use crate::backend::BackendError;
use crate::limiter::Decision;

use super::super::is_noscript;
use super::super::script::{self, RedisHit, ScriptClock};
use super::super::slots::{Node, not_served_here};
use super::topology::Topology;

/// The first pause before resending a call the cluster could not take yet (TRYAGAIN,
/// CLUSTERDOWN, a failover under way); it doubles up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const LONGEST_PAUSE: Duration = Duration::from_millis(100);

/// One call of `hit`, to be run by `deadline` (its server's clock, µs) or not at all, sent
/// again after each redirect until it runs (a redirect means it did not) and again once after
/// a NOSCRIPT, with the scripts loaded on that node. The caller's deadline ends the loop.
pub(super) async fn run_call(
    topology: &Arc<Topology>,
    hit: &RedisHit,
    deadline: Option<u64>,
    local_now: u64,
) -> Result<Decision, BackendError> {
    let scripts = &topology.shared.scripts;
    let mut target = None;
    let mut pause = FIRST_PAUSE;
    let mut reloaded = false;
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    script::add_call(
        &mut pipe,
        scripts,
        hit,
        ScriptClock::Redis,
        deadline,
        local_now,
    );
    let mut asking = redis::pipe();
    asking.ignore_errors().cmd("ASKING");
    script::add_call(
        &mut asking,
        scripts,
        hit,
        ScriptClock::Redis,
        deadline,
        local_now,
    );
    loop {
        let (node, call) = match target.take() {
            Some(Resend::Asking(node)) => (node, &asking),
            Some(Resend::To(node)) => (node, &pipe),
            Some(Resend::Later) | None => (route(topology, &hit.key)?, &pipe),
        };
        let connection = topology.connection(&node);
        // The script's reply is the last one (after ASKING's OK).
        let replies = connection.send(call).await?;
        let reply = replies
            .into_iter()
            .next_back()
            .ok_or_else(|| BackendError::Protocol("no reply to a script call".into()))?;
        if is_noscript(&reply) && !reloaded {
            tracing::info!(node = %node, "a redis cluster node lost its scripts; loading them again");
            connection.load_scripts(scripts).await?;
            reloaded = true;
            target = Some(Resend::To(node));
            continue;
        }
        let resend = match &reply {
            Value::ServerError(_) => reply
                .clone()
                .extract_error()
                .err()
                .and_then(|e| Resend::after(&e)),
            _ => None,
        };
        match resend {
            Some(Resend::Later) => {}
            Some(resend) => {
                target = Some(resend);
                continue;
            }
            None => match script::decision(&reply) {
                // The key the script read first is not served here (its slot is moving
                // and the key moved, or the cluster is failing over): nothing ran.
                Err(BackendError::Unavailable(message)) if not_served_here(&message) => {}
                result => return result,
            },
        }
        topology.read_soon();
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

/// The node the slot map names for `key`, else a seed (which redirects).
fn route(topology: &Topology, key: &str) -> Result<Node, BackendError> {
    let mapped = (topology.map()).and_then(|map| map.node_of(key.as_bytes()).cloned());
    mapped
        .or_else(|| topology.any_seed().cloned())
        .ok_or_else(|| BackendError::Config("no redis cluster node to send a call to".into()))
}

/// Where to send a call again.
#[derive(Debug, Clone, PartialEq)]
enum Resend {
    /// To this node, preceded by ASKING: the slot is moving there and the key has moved.
    Asking(Node),
    /// To this node, which owns the slot now.
    To(Node),
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
            Some(Node {
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

    fn node(host: &str, port: u16) -> Node {
        Node {
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
