//! A Redis some milliseconds away: a TCP relay in the test process that holds every byte for
//! a fixed delay in each direction before passing it on, in order, as a WAN link would. It
//! counts the connections it accepted, so a test can tell a kept connection from a new one.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The relay; dropping it stops accepting (open connections end with the test's runtime).
pub struct DelayedLink {
    address: SocketAddr,
    accepted: Arc<AtomicUsize>,
    /// The delay each way, in µs: bytes read from now on are held this long.
    one_way_micros: Arc<AtomicU64>,
    acceptor: tokio::task::JoinHandle<()>,
}

impl DelayedLink {
    /// A relay on a free loopback port to `redis_port`, adding `one_way` each way.
    pub async fn to(redis_port: u16, one_way: Duration) -> DelayedLink {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a relay");
        let address = listener.local_addr().expect("the relay's address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let one_way_micros = Arc::new(AtomicU64::new(one_way.as_micros() as u64));
        let acceptor = tokio::spawn({
            let accepted = accepted.clone();
            let one_way = one_way_micros.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", redis_port)).await else {
                        continue;
                    };
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    delayed(client_read, server_write, one_way.clone());
                    delayed(server_read, client_write, one_way.clone());
                }
            }
        });
        DelayedLink {
            address,
            accepted,
            one_way_micros,
            acceptor,
        }
    }

    /// `redis://` URL of the relay.
    pub fn url(&self) -> String {
        format!("redis://{}", self.address)
    }

    /// Holds the bytes read from now on `one_way` each way (on every connection, open or
    /// new); bytes already held keep their time, so order is kept.
    pub fn set_delay(&self, one_way: Duration) {
        (self.one_way_micros).store(one_way.as_micros() as u64, Ordering::SeqCst);
    }

    /// How many connections the relay has accepted so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for DelayedLink {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

/// Copies `from` to `to`, each chunk the delay in force (µs) after it was read, in order;
/// either side closing closes the other.
fn delayed(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay_micros: Arc<AtomicU64>,
) {
    let (chunks, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    tokio::spawn(async move {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let read = match from.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            let delay = Duration::from_micros(delay_micros.load(Ordering::SeqCst));
            if chunks
                .send((Instant::now() + delay, buffer[..read].to_vec()))
                .is_err()
            {
                return;
            }
        }
    });
    tokio::spawn(async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
}
