//! TLS on a listener (rustls): the gRPC port (`grpc_tls`) and the admin API (`admin_tls`).
//! A server certificate and, with a client CA, mutual TLS: a client without a certificate
//! that chains to the CA is refused in the handshake.
//!
//! **The files** are read as [`crate::files`] reads every file: regular files only (a
//! FIFO or a device in a file's place is refused, links followed), at most
//! [`PEM_MAX_BYTES`] each.
//!
//! **Only a certificate within its validity period is served** (`validity.rs`): every
//! client that verifies the server would refuse one that expired or is not valid yet. At
//! start-up such a certificate stops the start, with an error naming the file and both
//! dates.
//!
//! **Rotation.** The files are read again every `reload_interval_ms`, on tokio's blocking
//! pool; a change that loads becomes the configuration of every new connection
//! (cert-manager and Envoy Gateway renew certificates in place), one that does not (a file
//! that does not read, a key that does not match, a certificate outside its validity) is
//! logged naming the file and why, and the configuration in force stays. Open connections
//! keep the certificate they were made with.
//!
//! **Handshakes do not hold up accepting.** Each runs on its own beside the others, bounded
//! by the handshake timeout, and only finished ones reach the server.

mod validity;

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, Stream, StreamExt};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};

use crate::edge::listener::Acceptor;
use crate::edge::listener::Connection;
use crate::files::{self, FileError, PEM_MAX_BYTES};
use crate::settings::ListenerTls;
use validity::Validity;

/// A TLS setting that cannot be served, named by its settings section.
#[derive(Debug, thiserror::Error)]
#[error("{section}: {problem}")]
pub struct TlsError {
    section: &'static str,
    problem: Problem,
}

#[derive(Debug, thiserror::Error)]
enum Problem {
    #[error("{0}")]
    Settings(&'static str),
    #[error("{0}")]
    Read(#[from] FileError),
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

/// The application protocols a listener offers in the handshake (ALPN).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocols {
    /// gRPC: HTTP/2 only.
    Grpc,
    /// HTTP/2 (the admin API's gRPC form) and HTTP/1.1 (`curl`).
    Http,
}

impl Protocols {
    fn alpn(self) -> Vec<Vec<u8>> {
        match self {
            Protocols::Grpc => vec![b"h2".to_vec()],
            Protocols::Http => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        }
    }
}

/// A listener's TLS configuration, as last loaded from its files.
pub struct ServerTls {
    section: &'static str,
    protocols: Protocols,
    settings: ListenerTls,
    current: ArcSwap<ServerConfig>,
    /// The files' contents the configuration in force was built from.
    loaded: Mutex<Files>,
}

/// The contents of the TLS files.
#[derive(Clone, PartialEq, Eq)]
struct Files {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl ServerTls {
    /// The configuration `settings` (the section `section`) describe, offering
    /// `protocols`; `None` when they set no certificate (plain text).
    pub fn load(
        section: &'static str,
        settings: &ListenerTls,
        protocols: Protocols,
    ) -> Result<Option<Arc<ServerTls>>, TlsError> {
        let error = |problem| TlsError { section, problem };
        if settings.cert_file.is_none() && settings.key_file.is_none() {
            if settings.client_ca_file.is_some() {
                return Err(error(Problem::Settings(
                    "client_ca_file needs cert_file and key_file",
                )));
            }
            return Ok(None);
        }
        let files = Files::read(settings).map_err(error)?;
        let config = files.server_config(settings, protocols).map_err(error)?;
        Ok(Some(Arc::new(ServerTls {
            section,
            protocols,
            settings: settings.clone(),
            current: ArcSwap::from_pointee(config),
            loaded: Mutex::new(files),
        })))
    }

    /// Reads the files again and puts a changed configuration in force; whether it did.
    /// A change that does not load is an error, and the configuration in force stays.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let error = |problem| TlsError {
            section: self.section,
            problem,
        };
        let files = Files::read(&self.settings).map_err(error)?;
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        if *loaded == files {
            return Ok(false);
        }
        let config = (files.server_config(&self.settings, self.protocols)).map_err(error)?;
        self.current.store(Arc::new(config));
        *loaded = files;
        Ok(true)
    }

    /// Reloads every `reload_interval_ms` (never when 0), for as long as the process runs,
    /// each time on tokio's blocking pool: reading the files waits on the disk.
    pub fn spawn_reloader(self: &Arc<Self>) {
        if self.settings.reload_interval_ms == 0 {
            return;
        }
        let tls = self.clone();
        let period = Duration::from_millis(self.settings.reload_interval_ms);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let reloading = tokio::task::spawn_blocking({
                    let tls = tls.clone();
                    move || tls.reload()
                });
                match reloading.await {
                    Ok(Ok(true)) => tracing::info!("{}: certificate reloaded", tls.section),
                    Ok(Ok(false)) => {}
                    Ok(Err(error)) => tracing::error!(
                        "TLS files changed but do not load, the certificate in force stays: \
                         {error}"
                    ),
                    // The runtime is shutting down.
                    Err(_) => return,
                }
            }
        });
    }

    /// The connections `acceptor` accepts, once their handshake is done within `timeout`.
    pub fn incoming(self: Arc<Self>, acceptor: Acceptor, timeout: Duration) -> TlsIncoming {
        TlsIncoming {
            acceptor,
            tls: self,
            timeout,
            handshakes: FuturesUnordered::new(),
        }
    }
}

impl Files {
    fn read(settings: &ListenerTls) -> Result<Files, Problem> {
        let (Some(cert), Some(key)) = (&settings.cert_file, &settings.key_file) else {
            return Err(Problem::Settings("cert_file and key_file go together"));
        };
        Ok(Files {
            cert: read(cert)?,
            key: read(key)?,
            client_ca: settings.client_ca_file.as_deref().map(read).transpose()?,
        })
    }

    fn server_config(
        &self,
        settings: &ListenerTls,
        protocols: Protocols,
    ) -> Result<ServerConfig, Problem> {
        let invalid = |path: &Option<std::path::PathBuf>, message: String| Problem::Invalid {
            path: (path.as_deref()).map_or_else(String::new, |path| path.display().to_string()),
            message,
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<_, _>>()
            .map_err(|e| invalid(&settings.cert_file, e.to_string()))?;
        let Some(leaf) = chain.first() else {
            return Err(invalid(&settings.cert_file, "no certificate in it".into()));
        };
        let validity = Validity::of(leaf).map_err(|why| {
            invalid(
                &settings.cert_file,
                format!("the certificate's validity period does not read: {why}"),
            )
        })?;
        validity
            .check(jiff::Timestamp::now())
            .map_err(|why| invalid(&settings.cert_file, why))?;
        let key = PrivateKeyDer::from_pem_slice(&self.key)
            .map_err(|e| invalid(&settings.key_file, e.to_string()))?;
        let builder = ServerConfig::builder();
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let path = &settings.client_ca_file;
                let mut roots = RootCertStore::empty();
                for certificate in CertificateDer::pem_slice_iter(ca) {
                    let certificate = certificate.map_err(|e| invalid(path, e.to_string()))?;
                    roots
                        .add(certificate)
                        .map_err(|e| invalid(path, e.to_string()))?;
                }
                let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                    .build()
                    .map_err(|e| invalid(path, e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| invalid(&settings.key_file, e.to_string()))?;
        config.alpn_protocols = protocols.alpn();
        Ok(config)
    }
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, Problem> {
    Ok(files::read(path, PEM_MAX_BYTES)?)
}

/// Accepted connections after their TLS handshake (see the module).
pub struct TlsIncoming {
    acceptor: Acceptor,
    tls: Arc<ServerTls>,
    timeout: Duration,
    handshakes: FuturesUnordered<BoxFuture<'static, Option<Connection>>>,
}

impl Stream for TlsIncoming {
    type Item = io::Result<Connection>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        while let Poll::Ready(socket) = this.acceptor.poll_accept(cx) {
            let acceptor = TlsAcceptor::from(this.tls.current.load_full());
            let timeout = this.timeout;
            this.handshakes.push(Box::pin(async move {
                match tokio::time::timeout(timeout, acceptor.accept(socket)).await {
                    Ok(Ok(stream)) => Some(Connection::Tls(Box::new(stream))),
                    Ok(Err(error)) => {
                        tracing::debug!("TLS handshake refused: {error}");
                        None
                    }
                    Err(_) => {
                        tracing::debug!("TLS handshake not done within the handshake timeout");
                        None
                    }
                }
            }));
        }
        loop {
            match this.handshakes.poll_next_unpin(cx) {
                Poll::Ready(Some(Some(connection))) => return Poll::Ready(Some(Ok(connection))),
                Poll::Ready(Some(None)) => continue,
                // No handshake under way: the acceptor's waker is registered.
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}
