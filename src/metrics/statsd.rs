//! envoyproxy/ratelimit's stats sent to a statsd server (`statsd.addr`), beside `/metrics`:
//! for a deployment that reads them through a statsd exporter (Envoy Gateway runs one beside
//! upstream's image), so that swapping the image keeps its dashboards fed.
//!
//! Every `statsd.flush_interval_ms`, under upstream's names ([`super::Metrics::statsd_report`]),
//! each with the `statsd.extra_tags` suffix upstream's client writes (`.__key=value`):
//! - each count that changed since the last flush, as a statsd counter of its change
//!   (`name:change|c`);
//! - each gauge as it is (`name:value|g`), every flush, as upstream's client does;
//! - each timer's values since the last flush (`name:value|ms`); past `samples::KEPT`
//!   (1,000) of them, a uniform sample with statsd's sample
//!   rate (`|@0.25`), which the server scales back up, where upstream sends every value.
//!
//! Over TCP (upstream's default) one connection is kept and opened again after a failure;
//! over UDP the lines go in datagrams of at most `DATAGRAM` bytes. A flush that fails
//! loses no count (its changes go with the next one); its gauges and timer values are not
//! sent again.

use std::collections::HashMap;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};

use crate::settings::{StatsdProtocol, StatsdSettings};

/// The most bytes of one UDP datagram: what fits an Ethernet frame without fragmenting.
const DATAGRAM: usize = 1432;

/// How long opening the TCP connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// What one flush reports, under statsd names.
#[derive(Debug, Default)]
pub struct Report {
    /// Totals since start; their changes are sent.
    pub counters: Vec<(String, u64)>,
    pub gauges: Vec<(String, u64)>,
    pub timers: Vec<Timer>,
}

/// A timer's values since the last flush: `values` kept of `recorded`.
#[derive(Debug, Default)]
pub struct Timer {
    pub name: String,
    pub values: Vec<u64>,
    pub recorded: u64,
}

/// Sends what `report` reads to the statsd server of `settings`, every flush interval;
/// `None` when no server is set.
pub fn spawn(
    settings: &StatsdSettings,
    report: impl Fn() -> Report + Send + 'static,
) -> Option<tokio::task::JoinHandle<()>> {
    let addr = settings.addr.clone()?;
    let mut sink = Sink {
        addr,
        protocol: settings.protocol,
        suffix: tag_suffix(&settings.extra_tags),
        sent: HashMap::new(),
        connection: None,
        datagram_socket: None,
    };
    let interval = Duration::from_millis(settings.flush_interval_ms.max(1));
    Some(tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is at once: the load of the rules at start goes out, and the
        // response times are taken from then on.
        let mut health = Health::Working;
        loop {
            ticks.tick().await;
            let flushed = sink.flush(report()).await;
            if let Err(error) = health.after(flushed) {
                tracing::warn!(addr = %sink.addr, %error, "statsd: could not send the stats; trying again at each flush (logged again once it has worked)");
            }
        }
    }))
}

/// Whether the statsd server takes the stats, for the log: a failure is logged once, and
/// again only after the stats went out for [`WORKED`] flushes in a row. A datagram to a
/// closed UDP port fails only the send after the one that drew the refusal, so one flush in
/// two "works" there; one success is no sign that it works again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    Working,
    /// Failing (logged), with the flushes that went out since.
    Failing {
        worked: u32,
    },
}

/// Flushes in a row that must go out for a failing statsd server to count as working.
const WORKED: u32 = 3;

impl Health {
    /// Takes a flush's outcome; the error when it should be logged.
    fn after<E>(&mut self, flushed: Result<(), E>) -> Result<(), E> {
        match (flushed, *self) {
            (Ok(()), Health::Working) => Ok(()),
            (Ok(()), Health::Failing { worked }) => {
                *self = if worked + 1 >= WORKED {
                    Health::Working
                } else {
                    Health::Failing { worked: worked + 1 }
                };
                Ok(())
            }
            (Err(error), Health::Working) => {
                *self = Health::Failing { worked: 0 };
                Err(error)
            }
            (Err(_), Health::Failing { .. }) => {
                *self = Health::Failing { worked: 0 };
                Ok(())
            }
        }
    }
}

/// `key:value,key:value` as upstream's client writes tags on a plain statsd name:
/// `.__key=value` each, in the order given.
fn tag_suffix(tags: &str) -> String {
    (tags.split(','))
        .filter_map(|tag| tag.split_once(':'))
        .map(|(key, value)| format!(".__{}={}", key.trim(), value.trim()))
        .collect()
}

struct Sink {
    addr: String,
    protocol: StatsdProtocol,
    suffix: String,
    /// The totals the server has been sent.
    sent: HashMap<String, u64>,
    connection: Option<TcpStream>,
    /// The UDP socket, kept from flush to flush: a refusal (ICMP port unreachable) is told
    /// by the socket's next send, so a socket per flush would never hear of one.
    datagram_socket: Option<UdpSocket>,
}

impl Sink {
    /// Sends the counts' changes since the last flush that went out, the gauges and the
    /// timers' values.
    async fn flush(&mut self, report: Report) -> std::io::Result<()> {
        let mut lines = self.changes(&report.counters);
        let suffix = &self.suffix;
        for (name, value) in &report.gauges {
            lines.push(format!("{name}{suffix}:{value}|g\n"));
        }
        for timer in &report.timers {
            lines.extend(timer_lines(timer, suffix));
        }
        if !lines.is_empty() {
            self.send(&lines).await?;
        }
        self.sent.extend(report.counters);
        Ok(())
    }

    /// One `name:change|c` line per count whose total moved.
    fn changes(&self, totals: &[(String, u64)]) -> Vec<String> {
        (totals.iter())
            .filter_map(|(name, total)| {
                let change = total.saturating_sub(self.sent.get(name).copied().unwrap_or(0));
                (change > 0).then(|| format!("{name}{}:{change}|c\n", self.suffix))
            })
            .collect()
    }

    async fn send(&mut self, lines: &[String]) -> std::io::Result<()> {
        match self.protocol {
            StatsdProtocol::Tcp => {
                let connection = match self.connection.as_mut() {
                    Some(connection) => connection,
                    None => {
                        let connect = TcpStream::connect(&self.addr);
                        let connection = tokio::time::timeout(CONNECT_TIMEOUT, connect)
                            .await
                            .map_err(|_| std::io::ErrorKind::TimedOut)??;
                        self.connection.insert(connection)
                    }
                };
                let written = connection.write_all(lines.concat().as_bytes()).await;
                if written.is_err() {
                    self.connection = None;
                }
                written
            }
            StatsdProtocol::Udp => {
                let socket = match self.datagram_socket.as_mut() {
                    Some(socket) => socket,
                    None => {
                        let socket = UdpSocket::bind(("0.0.0.0", 0)).await?;
                        let connect = socket.connect(&self.addr);
                        tokio::time::timeout(CONNECT_TIMEOUT, connect)
                            .await
                            .map_err(|_| std::io::ErrorKind::TimedOut)??;
                        self.datagram_socket.insert(socket)
                    }
                };
                for datagram in datagrams(lines) {
                    if let Err(error) = socket.send(datagram.as_bytes()).await {
                        self.datagram_socket = None;
                        return Err(error);
                    }
                }
                Ok(())
            }
        }
    }
}

/// One `name:value|ms` line per value of `timer`, with the sample rate when they are a
/// sample of more.
fn timer_lines(timer: &Timer, suffix: &str) -> Vec<String> {
    let kept = timer.values.len() as u64;
    let rate = if kept < timer.recorded {
        format!("|@{}", kept as f64 / timer.recorded as f64)
    } else {
        String::new()
    };
    let name = &timer.name;
    (timer.values.iter())
        .map(|value| format!("{name}{suffix}:{value}|ms{rate}\n"))
        .collect()
}

/// `lines` packed into datagrams of at most [`DATAGRAM`] bytes (a longer line alone).
fn datagrams(lines: &[String]) -> Vec<String> {
    let mut datagrams = vec![String::new()];
    for line in lines {
        let last = datagrams.last_mut().expect("one datagram at least");
        if !last.is_empty() && last.len() + line.len() > DATAGRAM {
            datagrams.push(line.clone());
        } else {
            last.push_str(line);
        }
    }
    datagrams
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timer_sends_each_value_and_a_sample_its_rate() {
        let all = Timer {
            name: "t".into(),
            values: vec![120, 80],
            recorded: 2,
        };
        assert_eq!(
            timer_lines(&all, ".__a=b"),
            ["t.__a=b:120|ms\n", "t.__a=b:80|ms\n"]
        );
        let sample = Timer {
            name: "t".into(),
            values: vec![120],
            recorded: 4,
        };
        assert_eq!(timer_lines(&sample, ""), ["t:120|ms|@0.25\n"]);
    }

    #[test]
    fn tags_are_written_as_upstreams_client_writes_them() {
        assert_eq!(tag_suffix(""), "");
        assert_eq!(tag_suffix("env:prod, zone:eu"), ".__env=prod.__zone=eu");
    }

    #[test]
    fn only_the_change_since_the_last_flush_is_sent() {
        let mut sink = Sink {
            addr: String::new(),
            protocol: StatsdProtocol::Udp,
            suffix: ".__env=prod".into(),
            sent: HashMap::new(),
            connection: None,
            datagram_socket: None,
        };
        let totals = vec![
            ("a.total_hits".to_owned(), 5),
            ("a.over_limit".to_owned(), 0),
        ];
        assert_eq!(sink.changes(&totals), ["a.total_hits.__env=prod:5|c\n"]);
        sink.sent.extend(totals);
        let later = vec![
            ("a.total_hits".to_owned(), 7),
            ("a.over_limit".to_owned(), 0),
        ];
        assert_eq!(sink.changes(&later), ["a.total_hits.__env=prod:2|c\n"]);
    }

    #[test]
    fn a_failure_is_logged_once_until_the_stats_went_out_three_flushes_in_a_row() {
        let mut health = Health::Working;
        assert_eq!(health.after(Err("refused")), Err("refused"));
        // A closed UDP port: every other send fails.
        for _ in 0..50 {
            assert_eq!(health.after(Ok::<(), &str>(())), Ok(()));
            assert_eq!(health.after(Err("refused")), Ok(()));
        }
        for _ in 0..WORKED {
            assert_eq!(health.after(Ok::<(), &str>(())), Ok(()));
        }
        assert_eq!(health, Health::Working);
        assert_eq!(health.after(Err("refused")), Err("refused"));
    }

    #[test]
    fn datagrams_hold_whole_lines_within_the_bound() {
        let lines: Vec<String> = (0..100).map(|i| format!("stat.{i:040}:1|c\n")).collect();
        let packed = datagrams(&lines);
        assert!(packed.len() > 1);
        assert!(
            packed
                .iter()
                .all(|d| d.len() <= DATAGRAM && d.ends_with('\n'))
        );
        assert_eq!(packed.concat(), lines.concat());
    }
}
