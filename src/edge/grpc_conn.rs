//! The gRPC port's connections: HTTP/2 served by hyper around tonic's routes, each call held
//! to its deadline (`edge::grpc::CallDeadline`), each connection retired at its age.
//!
//! **Retirement.** With `max_connection_age_ms`, a connection that old is sent GOAWAY: its
//! client opens a new connection for its next calls (to whichever replica its balancer picks
//! now, the point of the setting) while the calls in flight finish. The age varies by ±10%
//! per connection, so that the connections a replica accepted together (every Envoy after a
//! rollout) do not all leave in the same second. `max_connection_age_grace_ms` bounds how
//! long their calls get once GOAWAY is sent; past it the connection is closed. 0 leaves
//! them until they finish, each bounded by its own deadline. (tonic's own maximum age is not
//! used: in tonic 0.14.5 its connection task panics once the age passes, and with a grace it
//! sends no GOAWAY at all, closing the connection at age + grace under its calls.)
//!
//! **Shutdown.** When the server stops, the listener is dropped at once (new clients go to
//! another replica), every open connection is sent GOAWAY, and [`serve`] returns once their
//! calls are done; `RunningServer::shutdown`'s grace period bounds that wait.

use std::convert::Infallible;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use futures_util::task::AtomicWaker;

use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use super::grpc_body::{CONNECTION_WINDOW, MAX_HEADER_LIST_BYTES, STREAM_WINDOW};
use crate::edge::listener::{Connection, Connections, next_until};
use crate::edge::unix_authority::UnixAuthority;

/// The largest HTTP/2 frame a client may send (the protocol's smallest maximum): what one
/// read of a body brings at most.
const MAX_FRAME_BYTES: u32 = 16 << 10;

/// Client-cancelled streams a connection may have pending before h2 calls it abusive (the
/// rapid-reset guard; hyper's default is 20).
const OVERLOAD_PENDING_RESETS: usize = 1024;

/// How far a connection's age may stray from `max_connection_age_ms`, either way.
const AGE_JITTER: f64 = 0.1;

/// How a gRPC connection is held: HTTP/2's bounds and when it is retired.
#[derive(Debug, Clone, Copy)]
pub struct Http2Limits {
    pub max_concurrent_streams: u32,
    /// Pings on a connection with nothing to read; one unanswered for as long closes it.
    pub keepalive: Duration,
    /// A connection this old (±10%) is sent GOAWAY; `None`: never.
    pub max_age: Option<Duration>,
    /// How long a retired connection's calls get after GOAWAY; `None`: until they finish.
    pub max_age_grace: Option<Duration>,
}

/// What answers the port's calls: tonic's routes under floodgate's layers.
pub trait CallService:
    tower::Service<
        http::Request<Incoming>,
        Response = http::Response<tonic::body::Body>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S> CallService for S where
    S: tower::Service<
            http::Request<Incoming>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// Serves `service` on every connection `incoming` yields until `stopped`, then drops the
/// listener, sends every connection GOAWAY and returns once their calls are done.
pub async fn serve<S: CallService>(
    mut incoming: Connections,
    service: S,
    limits: Http2Limits,
    stopped: impl Future<Output = ()>,
) {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    // Under overload, answers fall behind and clients cancel the requests they stopped
    // waiting for; h2 answers 20 such resets with GOAWAY, which fails every request on the
    // connection, Envoy's included. Allow a load's worth. The windows bound what a client
    // may send before its bytes are read (`grpc_body.rs`).
    builder
        .timer(TokioTimer::new())
        .initial_connection_window_size(CONNECTION_WINDOW)
        .initial_stream_window_size(STREAM_WINDOW)
        .max_frame_size(MAX_FRAME_BYTES)
        .max_header_list_size(MAX_HEADER_LIST_BYTES as u32)
        .max_pending_accept_reset_streams(OVERLOAD_PENDING_RESETS)
        .max_concurrent_streams(limits.max_concurrent_streams)
        .keep_alive_interval(limits.keepalive)
        .keep_alive_timeout(limits.keepalive);
    // Every connection holds a receiver; the sender tells them to drain, and learns when
    // the last one is gone.
    let (drain, draining) = watch::channel(false);
    let mut stopped = pin!(stopped);
    loop {
        let Some(io) = next_until(&mut incoming, stopped.as_mut(), "gRPC").await else {
            break;
        };
        let retire_at = limits.max_age.map(|age| Instant::now() + jittered(age));
        tokio::spawn(serve_connection(
            builder.clone(),
            io,
            TowerToHyperService::new(service.clone()),
            retire_at,
            limits.max_age_grace,
            draining.clone(),
        ));
    }
    drop(incoming);
    drop(draining);
    let _ = drain.send(true);
    drain.closed().await;
}

/// `age`, ±[`AGE_JITTER`].
fn jittered(age: Duration) -> Duration {
    age.mul_f64(1.0 - AGE_JITTER + 2.0 * AGE_JITTER * fastrand::f64())
}

/// Serves one connection until it ends: sent GOAWAY at `retire_at` (then closed after
/// `grace`, if its calls are not done by then) or when the server drains.
async fn serve_connection<S: CallService>(
    builder: http2::Builder<TokioExecutor>,
    io: Connection,
    service: TowerToHyperService<S>,
    retire_at: Option<Instant>,
    grace: Option<Duration>,
    mut draining: watch::Receiver<bool>,
) {
    // A C-core client's Unix-socket authority, which h2 refuses, is mended on the way in.
    let unix = io.is_unix();
    let io = UnixAuthority::new(io, unix);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    let mut connection = pin!(WakesInTurn::new(connection));
    let mut retire = pin!(sleep_until_or_never(retire_at));
    let mut closes_at = pin!(sleep_until_or_never(None));
    let mut goaway_sent = false;
    loop {
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(error) = served {
                    tracing::debug!("gRPC connection closed: {error}");
                }
                break;
            }
            () = retire.as_mut(), if !goaway_sent => {
                tracing::debug!("retiring a gRPC connection at its max age");
                connection.as_mut().get_pin_mut().graceful_shutdown();
                goaway_sent = true;
                if let Some(grace) = grace {
                    closes_at.set(sleep_until_or_never(Some(Instant::now() + grace)));
                }
            }
            _ = draining.wait_for(|drain| *drain), if !goaway_sent => {
                connection.as_mut().get_pin_mut().graceful_shutdown();
                goaway_sent = true;
            }
            () = closes_at.as_mut() => {
                tracing::debug!("closing a retired gRPC connection at the end of its grace");
                break;
            }
        }
    }
}

/// A connection whose wake-ups wait their turn in the runtime's queue.
///
/// hyper runs each stream in a task of its own, and a stream that answers wakes its
/// connection's task to write the answer. tokio runs a task woken by the running one next
/// (its LIFO slot), so the connection wrote every answer alone, one frame and one system call
/// each, between every two streams. Here a wake-up is a task spawned at the back of the
/// queue, and the wake-ups that come before it runs are one: the connection runs once the
/// streams queued before it have answered, and writes their answers together (20–25% more
/// decisions per second on the memory backend, docs/performance.md). The streams keep the
/// slot: a body's bytes are read, and charged to the body budget (`grpc_body.rs`), as soon as
/// the connection has them.
struct WakesInTurn<F> {
    inner: F,
    waker: Arc<InTurn>,
}

/// The wake-up a [`WakesInTurn`] connection hands out.
struct InTurn {
    /// The connection's own task.
    task: AtomicWaker,
    /// A wake-up is on its way.
    pending: AtomicBool,
    runtime: Handle,
}

impl<F> WakesInTurn<F> {
    fn new(inner: F) -> Self {
        WakesInTurn {
            inner,
            waker: Arc::new(InTurn {
                task: AtomicWaker::new(),
                pending: AtomicBool::new(false),
                runtime: Handle::current(),
            }),
        }
    }
}

impl<F: Future + Unpin> Future for WakesInTurn<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.waker.task.register(cx.waker());
        let waker = Waker::from(self.waker.clone());
        Pin::new(&mut self.inner).poll(&mut Context::from_waker(&waker))
    }
}

impl Wake for InTurn {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.pending.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        self.runtime.spawn(async move {
            this.pending.store(false, Ordering::Release);
            this.task.wake();
        });
    }
}

impl<F> WakesInTurn<F> {
    /// The connection inside, to be told to shut down.
    fn get_pin_mut(self: Pin<&mut Self>) -> Pin<&mut F>
    where
        F: Unpin,
    {
        Pin::new(&mut self.get_mut().inner)
    }
}

/// Sleeps until `at`, or forever.
async fn sleep_until_or_never(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts its wake-ups.
    struct Counting(std::sync::atomic::AtomicUsize);

    impl Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_connections_wake_ups_come_later_and_as_one() {
        let task = Arc::new(Counting(0.into()));
        let in_turn = Arc::new(InTurn {
            task: AtomicWaker::new(),
            pending: AtomicBool::new(false),
            runtime: Handle::current(),
        });
        in_turn.task.register(&Waker::from(task.clone()));
        for _ in 0..3 {
            in_turn.wake_by_ref();
        }
        assert_eq!(task.0.load(Ordering::SeqCst), 0, "not at once");
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "three wake-ups, one wake");
        in_turn.task.register(&Waker::from(task.clone()));
        in_turn.wake_by_ref();
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert_eq!(task.0.load(Ordering::SeqCst), 2, "and the next is another");
    }

    #[test]
    fn ages_stray_at_most_a_tenth_either_way_and_do_stray() {
        let age = Duration::from_secs(100);
        let ages: Vec<Duration> = (0..1000).map(|_| jittered(age)).collect();
        assert!(
            ages.iter()
                .all(|a| (90.0..=110.0).contains(&a.as_secs_f64()))
        );
        let (least, most) = (ages.iter().min().unwrap(), ages.iter().max().unwrap());
        assert!(
            *most - *least > Duration::from_secs(15),
            "{least:?}..{most:?}"
        );
    }
}
