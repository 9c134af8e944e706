//! `floodgate counters get|reset`: the admin API (`src/admin.rs`) from the command line.

use anyhow::{Context, bail};
use hyper_util::rt::TokioIo;
use serde_json::json;

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
    /// The admin token.
    #[arg(long, env = "FLOODGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub token: String,
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
    let (status, answer) = post(&args.addr, path, &args.token, body).await?;
    println!("{answer}");
    if status != 200 {
        bail!("the admin API answered {status}");
    }
    Ok(())
}

/// One HTTP/1.1 POST of JSON with the bearer `token`: the status and the body.
async fn post(addr: &str, path: &str, token: &str, body: String) -> anyhow::Result<(u16, String)> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to the admin API at {addr}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("HTTP/1.1 to the admin API")?;
    tokio::spawn(connection);
    let request = hyper::Request::post(path)
        .header(hyper::header::HOST, addr)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
        .body(axum::body::Body::from(body))?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(axum::body::Body::new(response.into_body()), 1 << 20).await?;
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}
