//! Where the standalone backend's connections come from, and when one must be given up.
//!
//! **Two sources, one request path.** `redis`: one address, connections made and verified by
//! a deadpool pool. `redis-sentinel`: the sentinels are asked for the primary's address for
//! every new connection (and the primary's ROLE is checked), so after a failover the next
//! connection opened reaches the new primary. Everything after the connection — pipelines,
//! scripts, NOSCRIPT reloads, the breaker, failure policies — does not know which source
//! made it.
//!
//! **A primary that became a replica is a broken connection.** A connection opened to the
//! primary stays open when that server is demoted (a failover that did not restart it; a DNS
//! name or Kubernetes Service that now points at another server), and every script call on
//! it answers READONLY. [`PrimaryConnection`] turns such an answer into an error of the whole
//! exchange, which makes the backend drop the connection; the next request opens a new one,
//! which finds the current primary.
//!
//! **A connection quiet for a while is checked before it carries a call.** A connection the
//! server closed while it carried nothing (the server restarted, a replica restarted before
//! a failover promoted it, an idle timeout) fails the next call sent on it, and that failure
//! cannot be told from one of a call that may have run. So a [`KeptConnection`] that has
//! carried nothing for [`QUIET`] is first asked a PING (bounded by the connect timeout), and a
//! dead one is replaced before any call goes out. A busy connection is never checked.
//!
//! **Credentials.** `username` / `password` from the settings replace the URL's, so a
//! password can come from a Kubernetes Secret instead of the URL. The password is never
//! printed: [`Password`] and [`RedisOptions`]' `Debug` redact it, and so does every error
//! message that names a URL ([`redact`]).

use std::fmt;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::{RedisOptions, lock};
use crate::backend::BackendError;
use deadpool_redis::redis::aio::{ConnectionLike, MultiplexedConnection};
use deadpool_redis::redis::io::tcp::TcpSettings;
use deadpool_redis::redis::sentinel::{
    SentinelClient, SentinelNodeConnectionInfo, SentinelServerType,
};
use deadpool_redis::redis::{
    self, AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo,
    RedisConnectionInfo, RedisError, RedisFuture, ServerErrorKind, TlsMode, Value,
};
use deadpool_redis::{Pool, Runtime};

/// PEM files for TLS to Redis (`rediss://`): a CA its certificate must chain to (else the
/// system's trust, or `SSL_CERT_FILE`), and a client certificate with its key, for a Redis
/// that requires one (`tls-auth-clients yes`).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisTls {
    pub ca: Option<Vec<u8>>,
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl RedisTls {
    pub(super) fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: (self.client.clone()).map(|(client_cert, client_key)| {
                redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }
            }),
            root_cert: self.ca.clone(),
        }
    }
}

/// The files' contents are never printed.
impl fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisOptions")
            .field("url", &redact(&self.url))
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("key_prefix", &self.key_prefix)
            .field("username", &self.username)
            .field("password", &self.password)
            .field("sentinel_master", &self.sentinel_master)
            .field("tls", &self.tls)
            .finish()
    }
}

/// How the standalone backend opens a connection to the primary.
pub(super) enum Source {
    /// One address (`redis://`, `rediss://`): a pool creates and verifies the connections.
    Direct(Pool),
    /// The primary the sentinels name at the time.
    Sentinel(Box<Sentinel>),
}

/// The sentinels, asked one lookup at a time.
pub(super) struct Sentinel {
    client: tokio::sync::Mutex<SentinelClient>,
    master: String,
    connect_timeout: Duration,
}

impl Source {
    /// The pool for `options.url`. No connection is made yet.
    pub fn direct(options: &RedisOptions) -> Result<Self, BackendError> {
        let settings_error = |e: &dyn fmt::Display| {
            BackendError::Config(format!("redis url {:?}: {e}", redact(&options.url)))
        };
        let info = connection_info(&options.url).map_err(|e| settings_error(&e))?;
        let redis = with_credentials(info.redis_settings().clone(), options);
        let mut info = info.set_redis_settings(redis);
        if let Some(certificates) = &options.tls {
            // The certificates go into the connection info, where the pool finds them.
            info = redis::Client::build_with_tls(info, certificates.certificates())
                .map_err(|e| settings_error(&e))?
                .get_connection_info()
                .clone();
        }
        let manager = deadpool_redis::Manager::new_with_config(info, exchanges())
            .map_err(|e| settings_error(&e))?;
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .wait_timeout(Some(options.command_timeout))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.command_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| BackendError::Config(format!("redis pool: {e}")))?;
        Ok(Source::Direct(pool))
    }

    /// The sentinels of `options.url` (comma-separated), asked for the primary named
    /// `options.sentinel_master`. Each URL's credentials are for its sentinel; the primary
    /// gets the settings' credentials, or else the first URL's. `rediss://` sentinel URLs
    /// mean TLS to the primary too. No connection is made yet.
    pub fn sentinel(options: &RedisOptions) -> Result<Self, BackendError> {
        let settings_error = |e: &dyn fmt::Display| {
            BackendError::Config(format!("redis sentinels {:?}: {e}", redact(&options.url)))
        };
        if options.tls.is_some() {
            return Err(BackendError::Config(
                "redis TLS files (a CA or a client certificate) are not supported with \
                 redis-sentinel: trust the CA through SSL_CERT_FILE"
                    .into(),
            ));
        }
        let urls = super::seeds(&options.url)?;
        let sentinels = urls
            .iter()
            .map(|url| {
                let info = connection_info(url)?;
                // Sentinels have no databases: a `/db` in the URL is for the primary.
                let redis = info.redis_settings().clone().set_db(0);
                Ok(info.set_redis_settings(redis))
            })
            .collect::<Result<Vec<ConnectionInfo>, RedisError>>()
            .map_err(|e| settings_error(&e))?;
        let first = connection_info(urls[0]).map_err(|e| settings_error(&e))?;
        let mut primary = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(with_credentials(first.redis_settings().clone(), options))
            .set_tcp_settings(nodelay());
        if let ConnectionAddr::TcpTls { insecure, .. } = first.addr() {
            primary = primary.set_tls_mode(if *insecure {
                TlsMode::Insecure
            } else {
                TlsMode::Secure
            });
        }
        let client = SentinelClient::build(
            sentinels,
            options.sentinel_master.clone(),
            Some(primary),
            SentinelServerType::Master,
        )
        .map_err(|e| settings_error(&e))?;
        Ok(Source::Sentinel(Box::new(Sentinel {
            client: tokio::sync::Mutex::new(client),
            master: options.sentinel_master.clone(),
            connect_timeout: options.connect_timeout,
        })))
    }

    /// A new connection to the primary, within the connect timeout.
    pub async fn connect(&self) -> Result<PrimaryConnection, BackendError> {
        match self {
            Source::Direct(pool) => {
                let pooled = pool.get().await.map_err(|e| match e {
                    // A server that accepts and never answers (stopped, cut off) is silent,
                    // not refusing.
                    deadpool_redis::PoolError::Timeout(_) => {
                        BackendError::NotReady(pool.timeouts().create.unwrap_or(Duration::ZERO))
                    }
                    e => BackendError::NothingCounted(format!("redis connection: {e}")),
                })?;
                Ok(PrimaryConnection(deadpool_redis::Connection::take(pooled)))
            }
            Source::Sentinel(sentinel) => sentinel.connect().await,
        }
    }
}

impl Sentinel {
    /// Asks the sentinels for the primary, checks its ROLE and connects, all within the
    /// connect timeout.
    async fn connect(&self) -> Result<PrimaryConnection, BackendError> {
        let bound = self.connect_timeout;
        let connect = async {
            let mut client = self.client.lock().await;
            client.get_async_connection_with_config(&exchanges()).await
        };
        match tokio::time::timeout(bound, connect).await {
            Ok(Ok(connection)) => Ok(PrimaryConnection(connection)),
            Ok(Err(e)) => Err(BackendError::NothingCounted(format!(
                "redis primary {:?} via the sentinels: {e}",
                self.master
            ))),
            Err(_) => Err(BackendError::NotReady(bound)),
        }
    }
}

/// How long a connection may carry nothing before it is checked ahead of its next call.
/// Closing an idle connection is what a restart, or Redis' `timeout`, does; a second is far
/// shorter than either takes to matter, and far longer than a busy connection is ever quiet.
pub(super) const QUIET: Duration = Duration::from_secs(1);

/// The one connection a lane or a cluster node keeps: opened when first needed (one opening
/// at a time), dropped when an exchange on it fails, and checked with a PING when it has been
/// quiet for [`QUIET`] (the module's comment says why).
pub(super) struct KeptConnection<C> {
    current: Mutex<Option<C>>,
    /// Held while a connection is opened or checked, so concurrent callers wait for one.
    opening: tokio::sync::Mutex<()>,
    /// When the current connection last began or finished an exchange: µs after `epoch`.
    used: AtomicU64,
    epoch: Instant,
    /// Bound on the check's PING.
    check_timeout: Duration,
}

impl<C: ConnectionLike + Clone + Send> KeptConnection<C> {
    /// None open yet; a check waits at most `check_timeout` for its PONG.
    pub fn new(check_timeout: Duration) -> Self {
        KeptConnection {
            current: Mutex::new(None),
            opening: tokio::sync::Mutex::new(()),
            used: AtomicU64::new(0),
            epoch: Instant::now(),
            check_timeout,
        }
    }

    /// The connection to send on: the current one, checked first if it has been quiet, or
    /// a new one from `open`.
    pub async fn get<F>(&self, open: impl FnOnce() -> F) -> Result<C, BackendError>
    where
        F: Future<Output = Result<C, BackendError>>,
    {
        if let Some(connection) = self.busy() {
            return Ok(connection);
        }
        let _opening = self.opening.lock().await;
        if let Some(connection) = self.busy() {
            return Ok(connection);
        }
        let quiet = lock(&self.current).clone();
        if let Some(mut connection) = quiet {
            if answers(&mut connection, self.check_timeout).await {
                self.used();
                return Ok(connection);
            }
            self.drop_current();
        }
        let connection = open().await?;
        *lock(&self.current) = Some(connection.clone());
        self.used();
        Ok(connection)
    }

    /// An exchange on the connection finished with an answer.
    pub fn used(&self) {
        let micros = self.epoch.elapsed().as_micros();
        self.used
            .store(u64::try_from(micros).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// An exchange on the connection failed: the next call opens another.
    pub fn drop_current(&self) {
        *lock(&self.current) = None;
    }

    /// The current connection, if it is not quiet (it is marked used).
    fn busy(&self) -> Option<C> {
        let connection = lock(&self.current).clone()?;
        let used = Duration::from_micros(self.used.load(Ordering::Relaxed));
        if self.epoch.elapsed().saturating_sub(used) >= QUIET {
            return None;
        }
        self.used();
        Some(connection)
    }
}

/// Whether the server answers a PING on `connection` (any reply, an error included, means
/// the connection is alive) within `bound`.
async fn answers<C: ConnectionLike + Send>(connection: &mut C, bound: Duration) -> bool {
    let ping = redis::cmd("PING");
    let reply = tokio::time::timeout(bound, ping.query_async::<Value>(connection)).await;
    match reply {
        Ok(Ok(_)) => true,
        Ok(Err(error)) => matches!(error.kind(), ErrorKind::Server(_)),
        Err(_) => false,
    }
}

/// A multiplexed connection to the server that was the primary when it was opened. An
/// exchange it answers with READONLY (that server is a replica now) fails as a whole, like
/// a dropped connection, so that the backend replaces the connection.
#[derive(Clone)]
pub(super) struct PrimaryConnection(MultiplexedConnection);

impl ConnectionLike for PrimaryConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let reply = self.0.req_packed_command(cmd).await?;
            refuse_replica(std::slice::from_ref(&reply))?;
            Ok(reply)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let replies = self.0.req_packed_commands(cmd, offset, count).await?;
            refuse_replica(&replies)?;
            Ok(replies)
        })
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

/// An error if any reply is READONLY: the server is no longer the primary.
fn refuse_replica(replies: &[Value]) -> Result<(), RedisError> {
    let demoted = replies.iter().any(|reply| {
        matches!(reply, Value::ServerError(error)
            if error.kind() == Some(ServerErrorKind::ReadOnly))
    });
    if demoted {
        return Err(RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "the server is a read-only replica now (was it demoted by a failover?)",
        )));
    }
    Ok(())
}

/// `url` parsed, with TCP_NODELAY: redis-rs leaves Nagle on, which holds each small pipeline
/// back until the previous one is acknowledged (measured: 14k decisions/s and p50 4 ms, with
/// the server and Redis both mostly idle).
pub(super) fn connection_info(url: &str) -> Result<ConnectionInfo, RedisError> {
    Ok(url.into_connection_info()?.set_tcp_settings(nodelay()))
}

/// The connection's own per-command timeout (redis-rs: 500 ms) is off: the backend bounds
/// each request's whole exchange with the command timeout already, and a second timer per
/// command costs CPU on every decision.
pub(super) fn exchanges() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new().set_response_timeout(None)
}

fn nodelay() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

/// `redis` with the settings' user name and password in place of the URL's, where given.
pub(super) fn with_credentials(
    mut redis: RedisConnectionInfo,
    options: &RedisOptions,
) -> RedisConnectionInfo {
    if let Some(username) = &options.username {
        redis = redis.set_username(username);
    }
    if let Some(password) = &options.password {
        redis = redis.set_password(password.expose());
    }
    redis
}

/// `urls` (one URL or a comma-separated list) with every password replaced by `***`, for
/// messages and logs.
pub fn redact(urls: &str) -> String {
    urls.split(',')
        .map(redact_one)
        .collect::<Vec<_>>()
        .join(",")
}

fn redact_one(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}{path}"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Password;

    fn options(url: &str, username: Option<&str>, password: Option<&str>) -> RedisOptions {
        RedisOptions {
            url: url.into(),
            pool_size: 1,
            connect_timeout: Duration::from_millis(250),
            command_timeout: Duration::from_millis(15),
            max_wait: Duration::from_millis(40),
            key_prefix: String::new(),
            username: username.map(Into::into),
            password: password.map(Password::new),
            sentinel_master: "mymaster".into(),
            tls: None,
        }
    }

    #[test]
    fn passwords_in_urls_are_redacted_and_the_rest_is_kept() {
        assert_eq!(
            redact("redis://app:s3cr@t@10.0.0.1:6379/2"),
            "redis://app:***@10.0.0.1:6379/2"
        );
        assert_eq!(
            redact("rediss://:pw@a:1/#insecure, redis://b:2"),
            "rediss://:***@a:1/#insecure, redis://b:2"
        );
        assert_eq!(redact("redis://user@host:1/"), "redis://user@host:1/");
        assert_eq!(redact("not a url"), "not a url");
    }

    #[test]
    fn a_password_prints_redacted() {
        let password = Password::new("hunter2");
        assert_eq!(format!("{password:?}"), "<redacted>");
        assert_eq!(password.expose(), "hunter2");
    }

    #[test]
    fn settings_credentials_replace_the_urls() {
        let url = "redis://urluser:urlpass@127.0.0.1:6379";
        let info = connection_info(url).expect("a valid url");
        let options = options(url, Some("floodgate"), Some("secret"));
        let redis = with_credentials(info.redis_settings().clone(), &options);
        assert_eq!(redis.username(), Some("floodgate"));
        assert_eq!(redis.password(), Some("secret"));
        let debug = format!("{options:?}");
        assert!(
            !debug.contains("urlpass") && !debug.contains("secret"),
            "{debug}"
        );
    }

    #[test]
    fn without_settings_credentials_the_urls_are_kept() {
        let url = "redis://urluser:urlpass@127.0.0.1:6379";
        let info = connection_info(url).expect("a valid url");
        let redis = with_credentials(info.redis_settings().clone(), &options(url, None, None));
        assert_eq!(redis.username(), Some("urluser"));
        assert_eq!(redis.password(), Some("urlpass"));
    }

    #[test]
    fn a_readonly_reply_fails_the_exchange_and_other_errors_do_not() {
        let reply = |text: &str| {
            redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).expect("an error reply")
        };
        let readonly = reply("READONLY You can't write against a read only replica.");
        let noscript = reply("NOSCRIPT No matching script.");
        assert!(refuse_replica(&[Value::Int(1), readonly]).is_err());
        assert!(refuse_replica(&[Value::Int(1), noscript]).is_ok());
    }
}
