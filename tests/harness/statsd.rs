//! A statsd server for the tests, shaped as the statsd exporter upstream deployments run:
//! it takes plain statsd lines over UDP or TCP and keeps counters summed, gauges at their
//! last value and every timer value with its sample rate.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::{TcpListener, UdpSocket};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What the server received so far.
#[derive(Debug, Default)]
pub struct Received {
    /// Counters (`|c`), summed by name.
    pub counters: HashMap<String, u64>,
    /// Gauges (`|g`), at their last value.
    pub gauges: HashMap<String, u64>,
    /// Timer values (`|ms`), each with its sample rate (1 without `|@rate`).
    pub timers: HashMap<String, Vec<(u64, f64)>>,
}

impl Received {
    pub fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    /// How many values timer `name` stands for: each counts as 1 / its sample rate.
    pub fn timed(&self, name: &str) -> f64 {
        (self.timers.get(name).into_iter().flatten())
            .map(|(_, rate)| 1.0 / rate)
            .sum()
    }

    /// Adds one statsd line; panics on a line a statsd server would refuse. A DogStatsD
    /// line's tags (`|#a:b,c:d`) are kept with its name, as `name|#a:b,c:d`.
    fn add(&mut self, line: &str) {
        let (name, rest) = line.split_once(':').expect("name:value|type");
        let mut parts = rest.split('|');
        let value: u64 = (parts.next().unwrap_or_default())
            .parse()
            .unwrap_or_else(|_| panic!("a whole number in {line:?}"));
        let kind = parts.next().unwrap_or_default();
        let mut rate = 1.0;
        let mut name = name.to_owned();
        for part in parts {
            if let Some(tags) = part.strip_prefix('#') {
                assert!(
                    tags.split(',').all(|tag| tag.split_once(':').is_some()),
                    "DogStatsD tags are key:value in {line:?}"
                );
                name = format!("{name}|#{tags}");
            } else {
                rate = (part.strip_prefix('@'))
                    .and_then(|rate| rate.parse::<f64>().ok())
                    .filter(|rate| *rate > 0.0 && *rate <= 1.0)
                    .unwrap_or_else(|| panic!("a sample rate in {line:?}"));
            }
        }
        match kind {
            "c" => *self.counters.entry(name).or_default() += value,
            "g" => drop(self.gauges.insert(name, value)),
            "ms" => self.timers.entry(name).or_default().push((value, rate)),
            other => panic!("statsd type {other:?} in {line:?}"),
        }
    }
}

/// A statsd server on a loopback port of its own.
pub struct StatsdServer {
    /// `host:port`, as `statsd.addr` takes it.
    pub addr: String,
    lines: mpsc::Receiver<String>,
    pub received: Received,
}

impl StatsdServer {
    /// `protocol`: `udp` or `tcp`.
    pub fn start(protocol: &str) -> StatsdServer {
        let (sender, lines) = mpsc::channel();
        let addr = match protocol {
            "udp" => {
                let socket = UdpSocket::bind("127.0.0.1:0").expect("a UDP port");
                let addr = socket.local_addr().expect("its address");
                std::thread::spawn(move || {
                    let mut datagram = [0u8; 65_536];
                    while let Ok(n) = socket.recv(&mut datagram) {
                        for line in String::from_utf8_lossy(&datagram[..n]).lines() {
                            if sender.send(line.to_owned()).is_err() {
                                return;
                            }
                        }
                    }
                });
                addr
            }
            "tcp" => {
                let listener = TcpListener::bind("127.0.0.1:0").expect("a TCP port");
                let addr = listener.local_addr().expect("its address");
                std::thread::spawn(move || {
                    for stream in listener.incoming().map_while(Result::ok) {
                        let sender = sender.clone();
                        std::thread::spawn(move || {
                            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                                if sender.send(line).is_err() {
                                    return;
                                }
                            }
                        });
                    }
                });
                addr
            }
            other => panic!("statsd over {other:?}"),
        };
        StatsdServer {
            addr: addr.to_string(),
            lines,
            received: Received::default(),
        }
    }

    /// Takes in what arrives until `done` says enough did; panics, showing what came,
    /// after `bound`.
    pub fn receive_until(&mut self, bound: Duration, done: impl Fn(&Received) -> bool) {
        let until = Instant::now() + bound;
        while !done(&self.received) {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.received.add(&line),
                Err(_) => panic!("statsd: not there after {bound:?}: {:?}", self.received),
            }
        }
    }
}
