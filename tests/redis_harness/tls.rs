//! Certificates for TLS tests, made at test time with the `openssl` command: a private CA
//! and a server certificate it signed for 127.0.0.1 and localhost, in a temporary directory
//! removed on drop.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A CA and a server certificate signed by it.
pub struct Certificates {
    dir: tempfile::TempDir,
}

/// What a TLS-only `redis-server` needs: its certificate, key, and the CA.
#[derive(Debug, Clone)]
pub struct ServerFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl ServerFiles {
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

impl Certificates {
    /// Generates the CA and the server certificate (RSA 2048, valid one day).
    pub fn generate() -> Certificates {
        let dir = tempfile::tempdir().expect("a temporary directory for certificates");
        let certificates = Certificates { dir };
        let dir = certificates.dir.path().display().to_string();
        openssl(&format!(
            "req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=floodgate-test-ca \
             -keyout {dir}/ca.key -out {dir}/ca.crt"
        ));
        openssl(&format!(
            "req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 \
             -keyout {dir}/server.key -out {dir}/server.csr"
        ));
        std::fs::write(
            certificates.dir.path().join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .expect("writing the certificate extensions");
        openssl(&format!(
            "x509 -req -in {dir}/server.csr -CA {dir}/ca.crt -CAkey {dir}/ca.key \
             -CAcreateserial -days 1 -extfile {dir}/server.ext -out {dir}/server.crt"
        ));
        certificates
    }

    /// The CA certificate (PEM): what a client must trust, e.g. through `SSL_CERT_FILE`.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    pub fn server_files(&self) -> ServerFiles {
        ServerFiles {
            cert: self.dir.path().join("server.crt"),
            key: self.dir.path().join("server.key"),
            ca: self.ca(),
        }
    }
}

/// Runs `openssl` with the blank-separated `args` (temporary paths hold no blanks); panics
/// with its output if it fails.
fn openssl(args: &str) {
    let output = Command::new("openssl")
        .args(args.split_whitespace())
        .output()
        .expect("openssl runs (is the openssl package installed?)");
    assert!(
        output.status.success(),
        "openssl {args}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
