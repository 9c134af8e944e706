//! floodgate started as envoyproxy/ratelimit is deployed: the binary linked as `ratelimit`
//! (the image's `/bin/ratelimit`) and given upstream's environment variables only, its
//! addresses read from its startup line, killed when dropped.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

/// A running floodgate started as `ratelimit`.
pub struct Upstream {
    child: Child,
    log: PathBuf,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    /// The Prometheus listener, when `USE_PROMETHEUS` opened one.
    pub metrics: Option<SocketAddr>,
}

impl Upstream {
    /// floodgate started as `ratelimit` with `env` (nothing else of the caller's
    /// environment), the link and its log in `dir`.
    pub fn start(dir: &Path, env: &[(&str, &str)]) -> Upstream {
        let binary = dir.join("ratelimit");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_floodgate"), &binary)
            .expect("a `ratelimit` link to the binary");
        let log = dir.join("stderr");
        let mut child = std::process::Command::new(&binary)
            .env_clear()
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("a log file"))
            .spawn()
            .expect("ratelimit starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the startup line");
        let address = |name: &str| {
            line.split_whitespace()
                .find_map(|part| part.strip_prefix(name))
                .and_then(|addr| addr.parse().ok())
        };
        let stderr = std::fs::read_to_string(&log).unwrap_or_default();
        Upstream {
            grpc: address("grpc=").unwrap_or_else(|| panic!("no grpc in {line:?}: {stderr}")),
            http: address("http=").unwrap_or_else(|| panic!("no http in {line:?}: {stderr}")),
            metrics: address("metrics="),
            child,
            log,
        }
    }

    /// What the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
