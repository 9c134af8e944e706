//! TLS for a test `redis-server`: the files it serves with, from the certificates the tests
//! generate (`tests/certs`).

use std::path::{Path, PathBuf};

#[path = "../certs/mod.rs"]
mod certs;

// Each test crate that includes the harness uses what it needs of these.
#[allow(unused_imports)]
pub use certs::{Certificates, Pair, text};

/// What a TLS-only `redis-server` needs: its certificate, key, and the CA.
#[derive(Debug, Clone)]
pub struct ServerFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl ServerFiles {
    /// The server certificate of `certificates`, and their CA.
    pub fn of(certificates: &Certificates) -> ServerFiles {
        let server = certificates.server();
        ServerFiles {
            cert: server.cert,
            key: server.key,
            ca: certificates.ca(),
        }
    }

    /// `redis-server` options: TLS on the given port only, clients not asked for a
    /// certificate.
    pub fn options(&self) -> Vec<String> {
        let path = |path: &Path| path.display().to_string();
        vec![
            "--port".into(),
            "0".into(),
            "--tls-cert-file".into(),
            path(&self.cert),
            "--tls-key-file".into(),
            path(&self.key),
            "--tls-ca-cert-file".into(),
            path(&self.ca),
            "--tls-auth-clients".into(),
            "no".into(),
        ]
    }
}
