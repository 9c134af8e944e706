//! The channel to the xDS server: plain HTTP/2, or TLS with the server checked against a CA
//! (or the system's roots) and, for mutual TLS, a client certificate. The files are read
//! at every connection, so certificates rotated on disk (cert-manager, Envoy Gateway) are
//! used from the next one; they are read on tokio's blocking pool, as [`crate::files`]
//! reads every file (regular files, at most [`PEM_MAX_BYTES`] each).

use std::path::Path;
use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::files::{self, FileError, PEM_MAX_BYTES};
use crate::settings::XdsSettings;

/// Why a subscription could not be made or kept.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    #[error("xds settings: {0}")]
    Settings(String),
    #[error("{0}")]
    File(#[from] FileError),
    #[error("connecting: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("the stream failed: {0}")]
    Stream(#[from] tonic::Status),
}

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Pings on an idle stream, and how long one may go unanswered before the connection is
/// dropped: a server that vanished without closing is noticed within both.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The endpoint of `settings.server_url`, with TLS for `https://`.
pub async fn endpoint(settings: &XdsSettings) -> Result<Endpoint, XdsError> {
    let url = &settings.server_url;
    let endpoint = Endpoint::from_shared(url.clone())
        .map_err(|error| XdsError::Settings(format!("server_url {url:?}: {error}")))?
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    if !url.starts_with("https://") {
        if settings.ca_file.is_some() || settings.cert_file.is_some() {
            return Err(XdsError::Settings(format!(
                "server_url {url:?} is not https://, but TLS files are set"
            )));
        }
        return Ok(endpoint);
    }
    let mut tls = match &settings.ca_file {
        Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca).await?)),
        None => ClientTlsConfig::new().with_native_roots(),
    };
    match (&settings.cert_file, &settings.key_file) {
        (Some(cert), Some(key)) => {
            tls = tls.identity(Identity::from_pem(read(cert).await?, read(key).await?));
        }
        (None, None) => {}
        _ => {
            return Err(XdsError::Settings(
                "xds.cert_file and xds.key_file go together".into(),
            ));
        }
    }
    if let Some(name) = &settings.server_name {
        tls = tls.domain_name(name.clone());
    }
    Ok(endpoint.tls_config(tls)?)
}

async fn read(path: &Path) -> Result<Vec<u8>, XdsError> {
    Ok(files::read_off_runtime(path.to_owned(), PEM_MAX_BYTES).await?)
}
