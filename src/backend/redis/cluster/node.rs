//! One connection per cluster node, floodgate's own: opened when first needed, dropped when
//! an exchange on it fails, opened again by the next call. Nothing is shared between nodes,
//! so a node that dies, restarts or leaves the cluster touches only the calls sent to it.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis;
use futures_util::future::BoxFuture;
use redis::aio::MultiplexedConnection;
use redis::{ConnectionAddr, ConnectionInfo, Value};

use crate::backend::BackendError;

use super::super::batcher::Link;
use super::super::connect::{KeptConnection, connection_info, exchanges, redact, with_credentials};
use super::super::script::{Scripts, Target};
use super::super::slots::Node;
use super::super::{RedisOptions, load_scripts, unavailable};

/// How to open a connection to any node: the first seed's scheme (TLS or not), the
/// credentials and the TLS files, with the node's address.
pub(in crate::backend::redis) struct NodeConnector {
    template: ConnectionInfo,
    connect_timeout: Duration,
}

impl NodeConnector {
    pub fn new(options: &RedisOptions, first_seed: &str) -> Result<Self, BackendError> {
        let settings_error = |e: &dyn std::fmt::Display| {
            BackendError::Config(format!("redis cluster {:?}: {e}", redact(&options.url)))
        };
        let info = connection_info(first_seed).map_err(|e| settings_error(&e))?;
        let redis = with_credentials(info.redis_settings().clone(), options);
        let mut template = info.set_redis_settings(redis);
        if let Some(certificates) = &options.tls {
            template = redis::Client::build_with_tls(template, certificates.certificates())
                .map_err(|e| settings_error(&e))?
                .get_connection_info()
                .clone();
        }
        Ok(NodeConnector {
            template,
            connect_timeout: options.connect_timeout,
        })
    }

    /// The address a seed URL names.
    pub fn seed(url: &str) -> Result<Node, BackendError> {
        let info = connection_info(url).map_err(|e| {
            BackendError::Config(format!("redis cluster seed {:?}: {e}", redact(url)))
        })?;
        match info.addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                Ok(Node {
                    host: host.clone(),
                    port: *port,
                })
            }
            _ => Err(BackendError::Config(format!(
                "redis cluster seed {:?}: a cluster is reached over TCP",
                redact(url)
            ))),
        }
    }

    /// A new connection to `node`, within the connect timeout.
    async fn connect(&self, node: &Node) -> Result<MultiplexedConnection, BackendError> {
        let addr = match self.template.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: node.host.clone(),
                port: node.port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(node.host.clone(), node.port),
        };
        let client = redis::Client::open(self.template.clone().set_addr(addr))
            .map_err(|e| BackendError::Config(format!("redis cluster node {node}: {e}")))?;
        let config = exchanges().set_connection_timeout(Some(self.connect_timeout));
        let connect = client.get_multiplexed_async_connection_with_config(&config);
        match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(e)) => Err(BackendError::NothingCounted(format!(
                "redis cluster node {node}: {e}"
            ))),
            Err(_) => Err(BackendError::NotReady(self.connect_timeout)),
        }
    }
}

/// The connection to one node, shared by its lane (a primary's), the calls sent alone and
/// the scripts' loading.
pub(in crate::backend::redis) struct NodeConnection {
    node: Node,
    name: String,
    connector: Arc<NodeConnector>,
    connection: KeptConnection<MultiplexedConnection>,
}

impl NodeConnection {
    pub fn new(node: Node, connector: Arc<NodeConnector>) -> Self {
        NodeConnection {
            name: node.to_string(),
            node,
            connection: KeptConnection::new(connector.connect_timeout),
            connector,
        }
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The open connection (checked if it has been quiet), or a new one.
    pub async fn get(&self) -> Result<MultiplexedConnection, BackendError> {
        (self.connection)
            .get(|| self.connector.connect(&self.node))
            .await
    }

    /// The connection failed an exchange: the next call opens another.
    pub fn drop_current(&self) {
        self.connection.drop_current();
    }

    /// Sends `pipe`; error replies come back as values. A failed exchange drops the
    /// connection.
    pub async fn send(&self, pipe: &redis::Pipeline) -> Result<Vec<Value>, BackendError> {
        let mut connection = self.get().await?;
        let sent: redis::RedisResult<Vec<Value>> = pipe.query_async(&mut connection).await;
        match sent {
            Ok(replies) => {
                self.connection.used();
                Ok(replies)
            }
            Err(error) => {
                self.drop_current();
                Err(unavailable(error))
            }
        }
    }

    /// One command; its error reply as a value.
    pub async fn query(&self, command: &redis::Cmd) -> Result<Value, BackendError> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors().add_command(command.clone());
        let replies = self.send(&pipe).await?;
        replies
            .into_iter()
            .next()
            .ok_or_else(|| BackendError::Protocol("no reply to the command".into()))
    }

    /// SCRIPT LOAD of every script on this node.
    pub async fn load_scripts(&self, scripts: &Scripts) -> Result<(), BackendError> {
        let mut connection = self.get().await?;
        let loaded = load_scripts(&mut connection, scripts).await;
        match loaded {
            Ok(()) => self.connection.used(),
            Err(_) => self.drop_current(),
        }
        loaded
    }
}

/// A primary's lane's link: that node's connection.
pub(in crate::backend::redis) struct NodeLink(pub Arc<NodeConnection>);

impl Link for NodeLink {
    fn target(&self) -> Target {
        Target::Server
    }

    fn query<'a>(&'a self, command: &'a redis::Cmd) -> BoxFuture<'a, Result<Value, BackendError>> {
        Box::pin(self.0.query(command))
    }

    fn load_scripts<'a>(&'a self, scripts: &'a Scripts) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(self.0.load_scripts(scripts))
    }

    fn reset(&self) {
        self.0.drop_current();
    }

    fn name(&self) -> &str {
        &self.0.name
    }
}
