//! `floodgate counters get|reset`: the admin API (`src/edge/admin.rs`) from the command line.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

/// What to do with a descriptor's counters.
#[derive(Debug, clap::Subcommand)]
pub enum CountersCommand {
    /// Print the counters of the rule a descriptor resolves to (counts nothing).
    Get(CounterArgs),
    /// Forget those counters, as if never hit.
    Reset(CounterArgs),
}

#[derive(Debug, clap::Args)]
pub struct CounterArgs {
    /// The admin API's address (`admin_addr`).
    #[arg(long, default_value = "127.0.0.1:9091")]
    pub addr: String,
    /// The admin token (none where the API takes mutual TLS alone).
    #[arg(long, env = "FLOODGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Speak TLS, trusting the server certificates this PEM CA signed (`admin_tls`).
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// The client certificate and key (PEM) for mutual TLS; with `--ca-file`.
    #[arg(long, requires_all = ["ca_file", "key_file"])]
    pub cert_file: Option<PathBuf>,
    #[arg(long, requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// The rate-limit domain.
    #[arg(long)]
    pub domain: String,
    /// The descriptor, `key=value[,key=value…]`.
    #[arg(long)]
    pub descriptor: String,
}

/// Sends the admin request and prints its JSON answer; an error for any status but 200.
pub async fn run(command: CountersCommand) -> anyhow::Result<()> {
    let (path, args) = match command {
        CountersCommand::Get(args) => ("/admin/v1/counters", args),
        CountersCommand::Reset(args) => ("/admin/v1/counters/reset", args),
    };
    let descriptor = crate::query::parse_descriptor(&args.descriptor)?;
    let entries: Vec<serde_json::Value> = (descriptor.entries.iter())
        .map(|entry| json!({ "key": entry.key, "value": entry.value }))
        .collect();
    let body = json!({ "domain": args.domain, "descriptor": entries }).to_string();
    let (status, answer) = post(&args, path, body).await?;
    println!("{answer}");
    if status != 200 {
        bail!("the admin API answered {status}");
    }
    Ok(())
}

/// One HTTP/1.1 POST of JSON, with the bearer token if any, over TLS if asked: the status
/// and the body.
async fn post(args: &CounterArgs, path: &str, body: String) -> anyhow::Result<(u16, String)> {
    let addr = &args.addr;
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to the admin API at {addr}"))?;
    match &args.ca_file {
        None => exchange(stream, args, path, body).await,
        Some(ca) => {
            let host = addr
                .rsplit_once(':')
                .map_or(addr.as_str(), |(host, _)| host);
            let name = ServerName::try_from(host.trim_matches(['[', ']']).to_owned())
                .with_context(|| format!("{host} is not a server name"))?;
            let connector = TlsConnector::from(Arc::new(client_config(ca, args)?));
            let stream = (connector.connect(name, stream).await)
                .with_context(|| format!("TLS with the admin API at {addr}"))?;
            exchange(stream, args, path, body).await
        }
    }
}

/// Trust in `ca`, and the client certificate where one is given.
fn client_config(ca: &PathBuf, args: &CounterArgs) -> anyhow::Result<ClientConfig> {
    let read = |path: &PathBuf| floodgate::files::read(path, floodgate::files::PEM_MAX_BYTES);
    let mut roots = RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(&read(ca)?) {
        roots.add(certificate.with_context(|| format!("{}", ca.display()))?)?;
    }
    let builder = ClientConfig::builder().with_root_certificates(roots);
    let mut config = match (&args.cert_file, &args.key_file) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_slice_iter(&read(cert)?)
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("{}", cert.display()))?;
            let key = PrivateKeyDer::from_pem_slice(&read(key)?)
                .with_context(|| format!("{}", key.display()))?;
            builder.with_client_auth_cert(chain, key)?
        }
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

async fn exchange(
    stream: impl AsyncRead + AsyncWrite + Unpin + Send + 'static,
    args: &CounterArgs,
    path: &str,
    body: String,
) -> anyhow::Result<(u16, String)> {
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("HTTP/1.1 to the admin API")?;
    tokio::spawn(connection);
    let mut request = hyper::Request::post(path)
        .header(hyper::header::HOST, &args.addr)
        .header(hyper::header::CONTENT_TYPE, "application/json");
    if let Some(token) = &args.token {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let response = sender
        .send_request(request.body(axum::body::Body::from(body))?)
        .await?;
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(axum::body::Body::new(response.into_body()), 1 << 20).await?;
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}
