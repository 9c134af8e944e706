//! A network partition between floodgate and Redis, without root or iptables: a TCP relay in
//! the test process that floodgate connects to instead of Redis. Cut, it keeps every
//! connection open and accepts new ones but forwards nothing either way (packets lost, no
//! reset, no close: what a partition looks like from both ends); healed, it relays again.
//! Bytes dropped during the cut leave an old connection's protocol out of step, so only
//! connections opened after the healing work again, as after a real partition with lost
//! segments.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The relay; dropping it stops accepting (open connections end with the test's runtime).
pub struct Partition {
    address: SocketAddr,
    cut: Arc<AtomicBool>,
    acceptor: tokio::task::JoinHandle<()>,
}

impl Partition {
    /// A relay on a free loopback port to `redis_port`, relaying.
    pub async fn relay_to(redis_port: u16) -> Partition {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a relay");
        let address = listener.local_addr().expect("the relay's address");
        let cut = Arc::new(AtomicBool::new(false));
        let acceptor = tokio::spawn({
            let cut = cut.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", redis_port)).await else {
                        continue;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::spawn(forward(client_read, server_write, cut.clone()));
                    tokio::spawn(forward(server_read, client_write, cut.clone()));
                }
            }
        });
        Partition {
            address,
            cut,
            acceptor,
        }
    }

    /// `redis://` URL of the relay.
    pub fn url(&self) -> String {
        format!("redis://{}", self.address)
    }

    /// From now on nothing gets through, either way.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    /// From now on everything gets through again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

/// Copies `from` to `to`, dropping what arrives while `cut` holds.
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if cut.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}
