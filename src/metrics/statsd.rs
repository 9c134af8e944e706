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
//! With `statsd.format = "dogstatsd"` (upstream's `USE_DOG_STATSD`) tags follow the value
//! instead (`name:1|c|#key:value`), and each name is first offered to `statsd.mogrifiers`:
//! the first whose pattern matches renames it and adds its tags, as upstream's DogStatsD
//! sink does.
//!
//! Over TCP (upstream's default) one connection is kept and opened again after a failure;
//! over UDP the lines go in datagrams of at most `DATAGRAM` bytes. A flush that fails
//! loses no count (its changes go with the next one); its gauges and timer values are not
//! sent again.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Display;
use std::time::Duration;

use regex::Regex;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};

use crate::settings::{Mogrifier, StatsdFormat, StatsdProtocol, StatsdSettings};

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
        style: Style::new(settings),
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
            let flushed = match sink.flush(report()).await {
                // Nothing went out: no sign either way.
                Ok(false) => continue,
                flushed => flushed.map(drop),
            };
            if let Err(error) = health.after(flushed) {
                tracing::warn!(addr = %sink.addr, %error, "statsd: could not send the stats; trying again at each flush (logged again once it has worked)");
            }
        }
    }))
}

/// Whether the statsd server takes the stats, for the log: a failure is logged once, and
/// again only after the stats went out for [`WORKED`] flushes in a row (a flush with nothing
/// to send counts neither way: on a quiet server those came between failures, and three of
/// them logged the same refusal twice in 2 s). A datagram to a
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
    tag_pairs(tags)
        .map(|(key, value)| format!(".__{key}={value}"))
        .collect()
}

/// The `(key, value)` pairs of `key:value,key:value`.
fn tag_pairs(tags: &str) -> impl Iterator<Item = (&str, &str)> {
    (tags.split(','))
        .filter_map(|tag| tag.split_once(':'))
        .map(|(key, value)| (key.trim(), value.trim()))
}

/// How one stat is written: statsd's name with its tags in it, or DogStatsD's tags after
/// the value.
enum Style {
    Statsd {
        /// The extra tags, `.__key=value` each.
        suffix: String,
    },
    Dogstatsd {
        /// The extra tags, `key:value` each.
        tags: Vec<String>,
        mogrifiers: Vec<Mogrify>,
    },
}

/// A mogrifier with its pattern compiled.
struct Mogrify {
    pattern: Regex,
    name: String,
    tags: Vec<(String, String)>,
}

impl Style {
    /// The style `settings` ask for. Settings checked the patterns at load.
    fn new(settings: &StatsdSettings) -> Style {
        match settings.format {
            StatsdFormat::Statsd => Style::Statsd {
                suffix: tag_suffix(&settings.extra_tags),
            },
            StatsdFormat::Dogstatsd => Style::Dogstatsd {
                tags: (tag_pairs(&settings.extra_tags))
                    .map(|(key, value)| format!("{key}:{value}"))
                    .collect(),
                mogrifiers: (settings.mogrifiers.iter())
                    .filter_map(Mogrify::new)
                    .collect(),
            },
        }
    }

    /// One line: `name`'s `value` of statsd type `kind` (`c`, `g`, `ms`), with `rate` (empty,
    /// or `|@0.25`).
    fn line(&self, name: &str, value: impl Display, kind: &str, rate: &str) -> String {
        match self {
            Style::Statsd { suffix } => format!("{name}{suffix}:{value}|{kind}{rate}\n"),
            Style::Dogstatsd { tags, mogrifiers } => {
                let (name, added) = (mogrifiers.iter())
                    .find_map(|mogrify| mogrify.apply(name))
                    .unwrap_or((Cow::Borrowed(name), Vec::new()));
                let all: Vec<&str> = (tags.iter().chain(&added)).map(String::as_str).collect();
                if all.is_empty() {
                    format!("{name}:{value}|{kind}{rate}\n")
                } else {
                    format!("{name}:{value}|{kind}{rate}|#{}\n", all.join(","))
                }
            }
        }
    }
}

impl Mogrify {
    fn new(mogrifier: &Mogrifier) -> Option<Mogrify> {
        Some(Mogrify {
            pattern: Regex::new(&mogrifier.pattern).ok()?,
            name: mogrifier.name.clone(),
            tags: (tag_pairs(&mogrifier.tags))
                .map(|(key, value)| (key.to_owned(), value.to_owned()))
                .collect(),
        })
    }

    /// `name` renamed, with this mogrifier's tags, when the pattern matches it.
    fn apply(&self, name: &str) -> Option<(Cow<'static, str>, Vec<String>)> {
        let groups = self.pattern.captures(name)?;
        let fill = |template: &str| substitute(template, &groups);
        let tags = (self.tags.iter())
            .map(|(key, value)| format!("{key}:{}", fill(value)))
            .collect();
        Some((Cow::Owned(fill(&self.name)), tags))
    }
}

/// `template` with each `$N` replaced by group N of `groups` (empty when it took no part).
fn substitute(template: &str, groups: &regex::Captures<'_>) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len() - at - 1);
        match rest[at + 1..at + 1 + digits].parse::<usize>() {
            Ok(group) => out.push_str(groups.get(group).map_or("", |m| m.as_str())),
            Err(_) => out.push('$'),
        }
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    out
}

struct Sink {
    addr: String,
    protocol: StatsdProtocol,
    style: Style,
    /// The totals the server has been sent.
    sent: HashMap<String, u64>,
    connection: Option<TcpStream>,
    /// The UDP socket, kept from flush to flush: a refusal (ICMP port unreachable) is told
    /// by the socket's next send, so a socket per flush would never hear of one.
    datagram_socket: Option<UdpSocket>,
}

impl Sink {
    /// Sends the counts' changes since the last flush that went out, the gauges and the
    /// timers' values; whether there was anything to send.
    async fn flush(&mut self, report: Report) -> std::io::Result<bool> {
        let mut lines = self.changes(&report.counters);
        for (name, value) in &report.gauges {
            lines.push(self.style.line(name, value, "g", ""));
        }
        for timer in &report.timers {
            lines.extend(timer_lines(timer, &self.style));
        }
        if !lines.is_empty() {
            self.send(&lines).await?;
        }
        self.sent.extend(report.counters);
        Ok(!lines.is_empty())
    }

    /// One `name:change|c` line per count whose total moved.
    fn changes(&self, totals: &[(String, u64)]) -> Vec<String> {
        (totals.iter())
            .filter_map(|(name, total)| {
                let change = total.saturating_sub(self.sent.get(name).copied().unwrap_or(0));
                (change > 0).then(|| self.style.line(name, change, "c", ""))
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
fn timer_lines(timer: &Timer, style: &Style) -> Vec<String> {
    let kept = timer.values.len() as u64;
    let rate = if kept < timer.recorded {
        format!("|@{}", kept as f64 / timer.recorded as f64)
    } else {
        String::new()
    };
    (timer.values.iter())
        .map(|value| style.line(&timer.name, value, "ms", &rate))
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
        let tagged = Style::Statsd {
            suffix: ".__a=b".into(),
        };
        assert_eq!(
            timer_lines(&all, &tagged),
            ["t.__a=b:120|ms\n", "t.__a=b:80|ms\n"]
        );
        let sample = Timer {
            name: "t".into(),
            values: vec![120],
            recorded: 4,
        };
        let plain = Style::Statsd {
            suffix: String::new(),
        };
        assert_eq!(timer_lines(&sample, &plain), ["t:120|ms|@0.25\n"]);
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
            style: Style::Statsd {
                suffix: ".__env=prod".into(),
            },
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

    fn dogstatsd(extra_tags: &str, mogrifiers: &[(&str, &str, &str)]) -> Style {
        Style::new(&StatsdSettings {
            format: StatsdFormat::Dogstatsd,
            extra_tags: extra_tags.into(),
            mogrifiers: (mogrifiers.iter())
                .map(|(pattern, name, tags)| Mogrifier {
                    pattern: (*pattern).into(),
                    name: (*name).into(),
                    tags: (*tags).into(),
                })
                .collect(),
            ..StatsdSettings::default()
        })
    }

    #[test]
    fn dogstatsd_puts_the_tags_after_the_value() {
        let style = dogstatsd("env:prod,zone:eu", &[]);
        assert_eq!(
            style.line("ratelimit.service.config_load_success", 1, "c", ""),
            "ratelimit.service.config_load_success:1|c|#env:prod,zone:eu\n"
        );
        assert_eq!(
            style.line("t", 120, "ms", "|@0.5"),
            "t:120|ms|@0.5|#env:prod,zone:eu\n"
        );
        let untagged = dogstatsd("", &[]);
        assert_eq!(untagged.line("g", 3, "g", ""), "g:3|g\n");
    }

    #[test]
    fn the_first_matching_mogrifier_renames_and_tags() {
        let style = dogstatsd(
            "env:prod",
            &[
                (
                    r"^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$",
                    "ratelimit.service.rate_limit.$3",
                    "domain:$1,descriptor:$2",
                ),
                (r"^ratelimit\.(.*)$", "never.$1", ""),
            ],
        );
        assert_eq!(
            style.line(
                "ratelimit.service.rate_limit.mongo_cps.database_users.within_limit",
                4,
                "c",
                ""
            ),
            "ratelimit.service.rate_limit.within_limit:4|c|#env:prod,domain:mongo_cps,descriptor:database_users\n"
        );
        assert_eq!(
            style.line("ratelimit.service.config_load_success", 1, "c", ""),
            "never.service.config_load_success:1|c|#env:prod\n"
        );
        assert_eq!(style.line("other", 1, "c", ""), "other:1|c|#env:prod\n");
    }

    #[test]
    fn a_template_takes_groups_by_number() {
        let groups = Regex::new(r"(a)(b)?-(c)").unwrap();
        let found = groups.captures("a-c").unwrap();
        assert_eq!(substitute("$1/$2/$3/$0/$", &found), "a//c/a-c/$");
        assert_eq!(substitute("x$10y", &found), "xy");
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
