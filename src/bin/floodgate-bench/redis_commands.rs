//! Redis command accounting: each Redis' `INFO commandstats`, read before and after the
//! measured interval. The difference over the decisions made is what a decision costs Redis
//! in commands (1 EVALSHA, or a pipeline's share, or retries and health checks on top).
//! Redis counts the commands a script runs as well (`TIME`, `HMGET` inside an EVALSHA), so
//! the total is what Redis executed, not the round trips to it: read EVALSHA for those.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use deadpool_redis::redis::{self, aio::MultiplexedConnection};

/// Calls per Redis command, by the name `INFO commandstats` gives it (`evalsha`,
/// `client|setinfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandCounts(BTreeMap<String, u64>);

impl CommandCounts {
    /// Reads `INFO commandstats`: one `cmdstat_<name>:calls=<n>,usec=…` line per command;
    /// anything else (the section header, fields it does not know) is skipped.
    pub fn parse(info: &str) -> CommandCounts {
        let calls = info.lines().filter_map(|line| {
            let (name, fields) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = fields
                .split(',')
                .find_map(|field| field.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        });
        CommandCounts(calls.collect())
    }

    /// The calls made since `before`; a counter that went down (a `CONFIG RESETSTAT` in
    /// between) counts from zero.
    pub fn since(&self, before: &CommandCounts) -> CommandCounts {
        let calls = self.0.iter().filter_map(|(name, &after)| {
            let before = before.0.get(name).copied().unwrap_or(0);
            let made = if after >= before {
                after - before
            } else {
                after
            };
            (made > 0).then(|| (name.clone(), made))
        });
        CommandCounts(calls.collect())
    }

    pub fn add(&mut self, other: &CommandCounts) {
        for (name, calls) in &other.0 {
            *self.0.entry(name.clone()).or_default() += calls;
        }
    }

    /// One call fewer of `command` (dropped once none are left).
    fn discount(&mut self, command: &str) {
        if let Some(calls) = self.0.get_mut(command) {
            *calls = calls.saturating_sub(1);
            if *calls == 0 {
                self.0.remove(command);
            }
        }
    }

    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// Commands by name, alphabetically.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.0.iter().map(|(name, &calls)| (name.as_str(), calls))
    }
}

/// The commands every Redis ran between two [`RedisNodes::read`]s, summed, less the
/// generator's own: the first reading's `INFO` is counted in the second (Redis counts a
/// command once it has run), once per node.
pub fn made_between(before: &[CommandCounts], after: &[CommandCounts]) -> CommandCounts {
    let mut total = CommandCounts::default();
    for (after, before) in after.iter().zip(before) {
        let mut made = after.since(before);
        made.discount("info");
        total.add(&made);
    }
    total
}

/// Connections to the Redis nodes to account, opened once so that connecting (and the
/// client's own set-up commands) happens before the first reading.
pub struct RedisNodes(Vec<(String, MultiplexedConnection)>);

/// How long connecting to or reading from a Redis may take before the run fails.
const REDIS_TIMEOUT: Duration = Duration::from_secs(5);

impl RedisNodes {
    /// Connects to each `host:port` (or `redis://` URL).
    pub async fn connect(addrs: &[String]) -> anyhow::Result<RedisNodes> {
        let mut nodes = Vec::with_capacity(addrs.len());
        for addr in addrs {
            let url = if addr.contains("://") {
                addr.clone()
            } else {
                format!("redis://{addr}")
            };
            let client = redis::Client::open(url.as_str())
                .with_context(|| format!("redis address {addr:?}"))?;
            let connection =
                tokio::time::timeout(REDIS_TIMEOUT, client.get_multiplexed_async_connection())
                    .await
                    .with_context(|| format!("connecting to redis {addr}: timed out"))?
                    .with_context(|| format!("connecting to redis {addr}"))?;
            nodes.push((addr.clone(), connection));
        }
        Ok(RedisNodes(nodes))
    }

    /// Each node's command counts so far, in the order given.
    pub async fn read(&mut self) -> anyhow::Result<Vec<CommandCounts>> {
        let mut counts = Vec::with_capacity(self.0.len());
        for (addr, connection) in &mut self.0 {
            let query = redis::cmd("INFO").arg("commandstats").to_owned();
            let info: String = tokio::time::timeout(REDIS_TIMEOUT, query.query_async(connection))
                .await
                .with_context(|| format!("INFO commandstats from redis {addr}: timed out"))?
                .with_context(|| format!("INFO commandstats from redis {addr}"))?;
            counts.push(CommandCounts::parse(&info));
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "# Commandstats\r\n\
        cmdstat_evalsha:calls=120,usec=900,usec_per_call=7.50,rejected_calls=0,failed_calls=0\r\n\
        cmdstat_client|setinfo:calls=2,usec=3,usec_per_call=1.50,rejected_calls=0,failed_calls=0\r\n\
        cmdstat_info:calls=1,usec=40,usec_per_call=40.00,rejected_calls=0,failed_calls=0\r\n\
        \r\n";

    fn counts(calls: &[(&str, u64)]) -> CommandCounts {
        CommandCounts(calls.iter().map(|&(n, c)| (n.to_owned(), c)).collect())
    }

    #[test]
    fn commandstats_lines_give_calls_per_command() {
        assert_eq!(
            CommandCounts::parse(INFO),
            counts(&[("client|setinfo", 2), ("evalsha", 120), ("info", 1)])
        );
    }

    #[test]
    fn unknown_lines_are_skipped() {
        let info = "# Commandstats\nnot_a_stat:calls=5\ncmdstat_get:usec=3\ncmdstat_set:calls=x\n";
        assert_eq!(CommandCounts::parse(info), CommandCounts::default());
    }

    #[test]
    fn since_keeps_only_commands_made_in_between() {
        let before = counts(&[("evalsha", 100), ("ping", 3)]);
        let after = counts(&[("evalsha", 250), ("ping", 3), ("cluster|slots", 1)]);
        assert_eq!(
            after.since(&before),
            counts(&[("cluster|slots", 1), ("evalsha", 150)])
        );
    }

    #[test]
    fn a_reset_counter_counts_from_zero() {
        let before = counts(&[("evalsha", 100)]);
        let after = counts(&[("evalsha", 7)]);
        assert_eq!(after.since(&before), counts(&[("evalsha", 7)]));
    }

    #[test]
    fn nodes_are_summed_without_the_generators_own_info_calls() {
        let before = [
            counts(&[("evalsha", 10), ("info", 4)]),
            counts(&[("evalsha", 5)]),
        ];
        let after = [
            counts(&[("evalsha", 30), ("info", 5)]),
            counts(&[("evalsha", 15), ("info", 1)]),
        ];
        let made = made_between(&before, &after);
        assert_eq!(made, counts(&[("evalsha", 30)]));
        assert_eq!(made.total(), 30);
    }
}
