//! Certificates for TLS tests, made at test time with the `openssl` command, in a temporary
//! directory removed on drop: a private CA, a server certificate it signed for 127.0.0.1 and
//! localhost, and a client certificate it signed (for mutual TLS). A second CA, trusted by
//! nobody, signs certificates that must be refused.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A CA, a server certificate and a client certificate signed by it.
pub struct Certificates {
    dir: tempfile::TempDir,
}

/// A certificate and its private key (PEM files).
#[derive(Debug, Clone)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Certificates {
    /// Generates the CA, the server and the client certificates (RSA 2048, valid one day).
    pub fn generate() -> Certificates {
        let dir = tempfile::tempdir().expect("a temporary directory for certificates");
        let certificates = Certificates { dir };
        certificates.authority("ca");
        certificates.sign(
            "ca",
            "server",
            "127.0.0.1",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        );
        certificates.sign(
            "ca",
            "client",
            "floodgate-test-client",
            "extendedKeyUsage=clientAuth",
        );
        certificates
    }

    /// The CA certificate (PEM): what a peer must trust, e.g. through `SSL_CERT_FILE`.
    pub fn ca(&self) -> PathBuf {
        self.path("ca.crt")
    }

    /// The server's certificate (127.0.0.1 and localhost) and key.
    pub fn server(&self) -> Pair {
        self.pair("server")
    }

    /// The server's certificate, its key and the CA, as settings take them: what a
    /// listener serving mutual TLS is given.
    pub fn mutual_server_files(&self) -> [String; 3] {
        let server = self.server();
        [text(&server.cert), text(&server.key), text(&self.ca())]
    }

    /// A client certificate the CA signed, for mutual TLS.
    pub fn client(&self) -> Pair {
        self.pair("client")
    }

    /// A client certificate signed by another CA, which no server here trusts.
    pub fn stranger(&self) -> Pair {
        if !self.path("stranger.crt").exists() {
            self.authority("other-ca");
            self.sign(
                "other-ca",
                "stranger",
                "stranger",
                "extendedKeyUsage=clientAuth",
            );
        }
        self.pair("stranger")
    }

    /// A new server certificate for the same names, with `serial` in its subject: what a
    /// rotation writes (cert-manager renews before expiry).
    pub fn reissue_server(&self, serial: u32) -> Pair {
        let name = format!("server-{serial}");
        self.sign(
            "ca",
            &name,
            &format!("127.0.0.1 {serial}"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        );
        self.pair(&name)
    }

    /// A new server certificate for the same names, with `serial` in its subject, valid
    /// only from `not_before` to `not_after` (`YYYYMMDDHHMMSSZ`): one already expired, or
    /// not valid yet, when the dates say so.
    pub fn reissue_server_dated(&self, serial: u32, not_before: &str, not_after: &str) -> Pair {
        let name = format!("server-{serial}");
        let dir = self.dir.path().display();
        openssl(&format!(
            "req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1_{serial} -keyout {dir}/{name}.key \
             -out {dir}/{name}.csr"
        ));
        // `openssl x509` sets no start date; `openssl ca` sets both, from its own database.
        std::fs::write(
            self.path("ca.cnf"),
            format!(
                "[ca]\ndefault_ca = test\n[test]\ndatabase = {dir}/index.txt\n\
                 new_certs_dir = {dir}\nserial = {dir}/ca.srl\ndefault_md = sha256\n\
                 policy = any\nunique_subject = no\n[any]\ncommonName = supplied\n"
            ),
        )
        .expect("writing the CA's configuration");
        if !self.path("index.txt").exists() {
            std::fs::write(self.path("index.txt"), "").expect("the CA's database");
        }
        if !self.path("ca.srl").exists() {
            std::fs::write(self.path("ca.srl"), "1000\n").expect("the CA's serial");
        }
        std::fs::write(
            self.path(&format!("{name}.ext")),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .expect("writing the certificate extensions");
        openssl(&format!(
            "ca -batch -notext -config {dir}/ca.cnf -cert {dir}/ca.crt -keyfile {dir}/ca.key \
             -in {dir}/{name}.csr -out {dir}/{name}.crt -extfile {dir}/{name}.ext \
             -startdate {not_before} -enddate {not_after}"
        ));
        self.pair(&name)
    }

    fn authority(&self, name: &str) {
        let dir = self.dir.path().display();
        openssl(&format!(
            "req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=floodgate-test-{name} \
             -keyout {dir}/{name}.key -out {dir}/{name}.crt"
        ));
    }

    fn sign(&self, authority: &str, name: &str, common_name: &str, extensions: &str) {
        let dir = self.dir.path().display();
        openssl(&format!(
            "req -newkey rsa:2048 -nodes -subj /CN={} -keyout {dir}/{name}.key \
             -out {dir}/{name}.csr",
            common_name.replace(' ', "_")
        ));
        std::fs::write(self.path(&format!("{name}.ext")), format!("{extensions}\n"))
            .expect("writing the certificate extensions");
        openssl(&format!(
            "x509 -req -in {dir}/{name}.csr -CA {dir}/{authority}.crt -CAkey {dir}/{authority}.key \
             -CAcreateserial -days 1 -extfile {dir}/{name}.ext -out {dir}/{name}.crt"
        ));
    }

    fn pair(&self, name: &str) -> Pair {
        Pair {
            cert: self.path(&format!("{name}.crt")),
            key: self.path(&format!("{name}.key")),
        }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }
}

/// Runs `openssl` with `arguments` (split on spaces), failing the test if it fails.
fn openssl(arguments: &str) {
    let output = Command::new("openssl")
        .args(arguments.split_whitespace())
        .output()
        .expect("the openssl command runs (apt-get install openssl)");
    assert!(
        output.status.success(),
        "openssl {arguments}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A path as text, for flags and settings.
pub fn text(path: &Path) -> String {
    path.display().to_string()
}
