//! What both listeners accept: connections (TCP, or a Unix socket's, from `socket.rs`) that
//! must earn the file descriptor they hold, and the [`Connection`] the gRPC server serves
//! (guarded, plain or under TLS).
//!
//! A connection is a file descriptor, and the process has a limited number of them. Left
//! alone, a client that connects and sends nothing, one that trickles a request's headers a
//! byte at a time, or one that vanished without a FIN holds its descriptor forever; enough
//! of them and every new client, `/healthz` included, is refused. So every accepted
//! connection is [`Guarded`]: it must send its first 24 bytes (an HTTP/2 client's whole
//! preface, the start of an HTTP/1 request) within the handshake timeout, and a connection
//! that sends nothing for the idle timeout is closed. HTTP/2 peers are pinged while idle, so a live client always
//! answers something and only a dead or silent one is cut. The rest of a connection's bounds
//! (streams, headers, request time) are set where it is served (`server.rs`).
//!
//! Accepting itself can fail: at the descriptor limit (`EMFILE`, or the system's, `ENFILE`)
//! the listener stays readable and an accept loop that retries at once spins a core doing
//! nothing. The [`Acceptor`] then makes room: the oldest connection that has not sent its
//! first bytes in its first [`ROOM_MIN_AGE`], on any port, is closed (a crowd of silent
//! connections would otherwise keep every new client waiting until the handshake timeout
//! frees them), and the accept is tried again 5 ms later. A connection past its handshake
//! is never closed this way: with none left to close, the acceptor waits from 5 ms doubling
//! to a second while the errors last, so the descriptors held can close. The soft
//! descriptor limit is raised to the hard one at start-up ([`raise_open_files_limit`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};

use tokio_rustls::server::TlsStream;

use crate::edge::socket::{Listener, Socket, delegate_io};

/// How long a connection may go without sending anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// From accept to the connection's first [`HANDSHAKE_BYTES`].
    pub handshake: Duration,
    /// Between any two reads that bring bytes, once those have come.
    pub idle: Duration,
}

/// What a connection must send within the handshake timeout: the length of the HTTP/2
/// client preface.
pub const HANDSHAKE_BYTES: usize = 24;

/// How long a connection has to send its first bytes before it may be closed to make room.
/// A client's first bytes come with its connection (an HTTP/2 preface or a TLS hello is
/// sent as soon as it connects), so only a silent connection gets this old without them;
/// and one just accepted, whose bytes came but were not read yet, is spared. (At the limit,
/// accepting fails even with no client waiting: the descriptor is taken before the queue is
/// looked at.)
pub const ROOM_MIN_AGE: Duration = Duration::from_millis(100);

/// A connection closed for silence: what its reads fail with.
fn silent(handshake: bool) -> io::Error {
    let what = if handshake {
        "no bytes within the handshake timeout"
    } else {
        "no bytes within the idle timeout"
    };
    io::Error::new(io::ErrorKind::TimedOut, what)
}

/// The accepted connections that have not sent their first [`HANDSHAKE_BYTES`] yet, in
/// accept order, each with a way to tell it to close. One for the whole process, shared by
/// every [`Acceptor`]: the descriptors are the process's, so whichever port runs out makes
/// room from all of them.
#[derive(Clone, Default)]
pub struct Handshaking(Arc<Mutex<Waiting>>);

#[derive(Default)]
struct Waiting {
    /// The number the next connection gets: numbers run in accept order.
    next: u64,
    /// When each was accepted, and how to tell it to close.
    closers: BTreeMap<u64, (Instant, oneshot::Sender<()>)>,
}

impl Handshaking {
    fn waiting(&self) -> std::sync::MutexGuard<'_, Waiting> {
        // Nothing panics while holding the lock; were it poisoned, the map is still whole.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Enrols a connection just accepted.
    fn enrol(&self) -> Enrolled {
        let (closer, told) = oneshot::channel();
        let mut waiting = self.waiting();
        let number = waiting.next;
        waiting.next += 1;
        waiting.closers.insert(number, (Instant::now(), closer));
        Enrolled {
            number,
            handshaking: self.clone(),
            told: Some(told),
        }
    }

    /// Tells the oldest connection still in its handshake, if it is [`ROOM_MIN_AGE`] old,
    /// to close; `false` when there is none.
    fn close_oldest(&self) -> bool {
        let mut waiting = self.waiting();
        let now = Instant::now();
        while let Some(oldest) = waiting.closers.first_entry() {
            // In accept order: the rest are younger still.
            if now - oldest.get().0 < ROOM_MIN_AGE {
                return false;
            }
            let (_, closer) = oldest.remove();
            // Refused only by a connection going away at this moment: try the next.
            if closer.send(()).is_ok() {
                return true;
            }
        }
        false
    }
}

/// The connections open on one port, and the most there may be
/// (`connection_limits.max_connections`): at that many, accepting waits as at the
/// descriptor limit (making room from the silent ones first), so that clients' connections,
/// each with its buffers and state, hold a bounded share of the process's memory. Each port
/// counts its own, so that clients filling the gRPC port leave the health checks' room on
/// the HTTP port.
#[derive(Debug)]
struct OpenConnections {
    open: AtomicUsize,
    most: usize,
}

impl OpenConnections {
    /// A place for one more connection, if the port may hold one.
    fn admit(self: &Arc<Self>) -> Option<Admitted> {
        (self.open)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < self.most).then_some(open + 1)
            })
            .ok()?;
        Some(Admitted(self.clone()))
    }
}

/// An open connection's place in its port's count, given up when dropped.
struct Admitted(Arc<OpenConnections>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection's place in [`Handshaking`], given up when dropped: once its handshake is
/// done, or with the connection.
struct Enrolled {
    number: u64,
    handshaking: Handshaking,
    /// Ready once the connection is told to close; `None` after that.
    told: Option<oneshot::Receiver<()>>,
}

impl Enrolled {
    /// Whether the connection was told to close; once it was, always.
    fn told_to_close(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(told) = &mut self.told else {
            return true;
        };
        // The sender is dropped unsent only with the whole registry, which this one holds.
        if Pin::new(told).poll(cx).is_pending() {
            return false;
        }
        self.told = None;
        true
    }
}

impl Drop for Enrolled {
    fn drop(&mut self) {
        self.handshaking.waiting().closers.remove(&self.number);
    }
}

/// What the reads of a connection closed to make room fail with.
fn closed_to_make_room() -> io::Error {
    io::Error::other("closed before its handshake to make room at the descriptor limit")
}

/// A connection the gRPC server serves: plain, or under TLS once its handshake is done.
pub enum Connection {
    Plain(Guarded<Socket>),
    Tls(Box<TlsStream<Guarded<Socket>>>),
}

delegate_io!(Connection, Plain, Tls);

impl Connection {
    /// Whether it came in on a Unix socket.
    pub fn is_unix(&self) -> bool {
        let socket = match self {
            Connection::Plain(guarded) => &guarded.io,
            Connection::Tls(tls) => &tls.get_ref().0.io,
        };
        matches!(socket, Socket::Unix(_))
    }
}

/// A listener's connections: plain, or after their TLS handshake.
pub type Connections = Pin<Box<dyn futures_util::Stream<Item = io::Result<Connection>> + Send>>;

/// The next connection of `incoming`, until `stopped`; `None` once either ends. A failed
/// accept or handshake is logged (naming the listener, `what`) and skipped.
pub async fn next_until(
    incoming: &mut Connections,
    mut stopped: Pin<&mut impl std::future::Future<Output = ()>>,
    what: &str,
) -> Option<Connection> {
    use futures_util::StreamExt;
    loop {
        tokio::select! {
            io = incoming.next() => match io? {
                Ok(io) => return Some(io),
                Err(error) => tracing::debug!("accepting a {what} connection: {error}"),
            },
            () = stopped.as_mut() => return None,
        }
    }
}

/// A connection that fails its reads once it has been silent too long (see the module).
pub struct Guarded<IO> {
    io: IO,
    timeouts: Timeouts,
    /// Fires when the connection has been silent for its current timeout; re-armed lazily,
    /// from `last_read`, so a busy connection does not touch the timer on every read.
    deadline: Pin<Box<Sleep>>,
    /// Bytes read, counted up to [`HANDSHAKE_BYTES`].
    received: usize,
    last_read: Instant,
    /// Until the handshake is done: its place among the connections that may be closed to
    /// make room.
    enrolled: Option<Enrolled>,
    /// Its place among the process's open connections.
    _admitted: Admitted,
}

impl<IO> Guarded<IO> {
    /// Guards `io`, enrolled in `handshaking` until its handshake is done, counted among
    /// the open connections as `admitted`.
    fn new(io: IO, timeouts: Timeouts, handshaking: &Handshaking, admitted: Admitted) -> Self {
        Guarded {
            io,
            timeouts,
            deadline: Box::pin(tokio::time::sleep(timeouts.handshake)),
            received: 0,
            last_read: Instant::now(),
            enrolled: Some(handshaking.enrol()),
            _admitted: admitted,
        }
    }

    /// `Err` once the connection has been silent for its whole timeout; otherwise the
    /// deadline is armed to wake the reader when it would be.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        loop {
            if self.deadline.as_mut().poll(cx).is_pending() {
                return Ok(());
            }
            if self.received < HANDSHAKE_BYTES {
                return Err(silent(true));
            }
            let idle_until = self.last_read + self.timeouts.idle;
            if idle_until <= Instant::now() {
                return Err(silent(false));
            }
            self.deadline.as_mut().reset(idle_until);
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // A peer trickling bytes never leaves the read pending: look at the deadline first.
        if this.deadline.is_elapsed() {
            this.check(cx)?;
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = buf.filled().len() - before;
                if read > 0 {
                    let now = Instant::now();
                    if this.received < HANDSHAKE_BYTES {
                        this.received += read;
                        if this.received >= HANDSHAKE_BYTES {
                            // The handshake deadline gives way to the idle one, and the
                            // connection is no longer one that may be closed to make room.
                            this.deadline.as_mut().reset(now + this.timeouts.idle);
                            this.enrolled = None;
                        }
                    }
                    this.last_read = now;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                // Told to close, it closes once nothing is left to read: a client whose
                // first bytes came but were not read yet is not cut for that.
                if let Some(enrolled) = &mut this.enrolled
                    && enrolled.told_to_close(cx)
                {
                    return Poll::Ready(Err(closed_to_make_room()));
                }
                this.check(cx)?;
                Poll::Pending
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Back-off after a failed accept: from the first wait, doubling, up to the last.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(5), Duration::from_secs(1));

/// The longest wait between looks for room while the process holds all the connections it
/// may: a client that leaves makes room for the next within this.
const AT_MOST_BACKOFF: Duration = Duration::from_millis(50);

/// A listener's accepted connections, guarded (TCP ones with no-delay set); accept errors
/// make room or wait, and retry (see the module), and are logged once per series.
pub struct Acceptor {
    /// The port's name in the log: `grpc` or `http`.
    name: &'static str,
    listener: Listener,
    timeouts: Timeouts,
    /// The process's connections still in their handshake, this acceptor's among them.
    handshaking: Handshaking,
    /// While accepting fails: the wait before the next try, and the current wait.
    backoff: Option<(Duration, Pin<Box<Sleep>>)>,
    /// Whether a series of failures is under way: accepting failed, and no accept has
    /// succeeded at its first try since. It is logged once.
    failing: bool,
    /// Whether the series has closed a connection to make room: also logged once.
    made_room: bool,
    /// The port's open connections, and the most it may hold.
    open: Arc<OpenConnections>,
}

impl Acceptor {
    pub fn new(
        name: &'static str,
        listener: impl Into<Listener>,
        timeouts: Timeouts,
        handshaking: Handshaking,
    ) -> Self {
        Acceptor {
            name,
            listener: listener.into(),
            timeouts,
            handshaking,
            backoff: None,
            failing: false,
            made_room: false,
            open: Arc::new(OpenConnections {
                open: AtomicUsize::new(0),
                most: usize::MAX,
            }),
        }
    }

    /// The acceptor, holding at most `most` connections open at once.
    pub fn at_most(self, most: usize) -> Self {
        let open = Arc::new(OpenConnections {
            open: AtomicUsize::new(0),
            most,
        });
        Acceptor { open, ..self }
    }

    /// The next connection; waits out accept errors, and the process holding all the
    /// connections it may, instead of returning them.
    pub fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<Guarded<Socket>> {
        loop {
            if let Some((_, wait)) = &mut self.backoff {
                ready!(wait.as_mut().poll(cx));
            }
            let Some(admitted) = self.open.admit() else {
                if !self.failing {
                    self.failing = true;
                    tracing::warn!(
                        port = self.name,
                        "holding connection_limits.max_connections ({}) connections: new \
                         ones wait until some close",
                        self.open.most
                    );
                }
                let made_room = self.handshaking.close_oldest();
                self.wait_before_trying_again(made_room, AT_MOST_BACKOFF);
                continue;
            };
            match ready!(self.listener.poll_accept(cx)) {
                Ok(socket) => {
                    // One that needed a retry (after making room, say) does not end the
                    // series: the next may fail the same way.
                    if self.backoff.take().is_none() {
                        (self.failing, self.made_room) = (false, false);
                    }
                    let guarded = Guarded::new(socket, self.timeouts, &self.handshaking, admitted);
                    return Poll::Ready(guarded);
                }
                // The client gave up before we accepted: nothing is wrong with the listener.
                Err(e) if is_connection_error(&e) => {}
                Err(e) => {
                    if !self.failing {
                        self.failing = true;
                        tracing::error!(
                            port = self.name,
                            "accepting a connection failed, waiting before trying again: {e}"
                        );
                    }
                    let made_room = is_out_of_descriptors(&e) && self.handshaking.close_oldest();
                    self.wait_before_trying_again(made_room, ACCEPT_BACKOFF.1);
                }
            }
        }
    }

    /// Arms the wait before the next try: the first wait again when room was made (that is
    /// progress), else twice the last, up to `longest`.
    fn wait_before_trying_again(&mut self, made_room: bool, longest: Duration) {
        if made_room && !self.made_room {
            self.made_room = true;
            tracing::warn!(
                port = self.name,
                "closing the connections that have not sent their first bytes, oldest \
                 first, to make room"
            );
        }
        let next = match &self.backoff {
            Some((last, _)) if !made_room => (*last * 2).min(longest),
            _ => ACCEPT_BACKOFF.0,
        };
        self.backoff = Some((next, Box::pin(tokio::time::sleep(next))));
    }

    /// The next connection (see [`poll_accept`](Self::poll_accept)).
    pub async fn accept(&mut self) -> Guarded<Socket> {
        std::future::poll_fn(|cx| self.poll_accept(cx)).await
    }
}

impl From<TcpListener> for Listener {
    fn from(listener: TcpListener) -> Self {
        Listener::Tcp(listener)
    }
}

/// Plain connections, as the gRPC server takes them (TLS ones come from `tls.rs`).
impl Stream for Acceptor {
    type Item = io::Result<Connection>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_accept(cx)
            .map(|io| Some(Ok(Connection::Plain(io))))
    }
}

/// The process (`EMFILE`) or the system (`ENFILE`) has no descriptor left.
fn is_out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Raises the soft limit on open files to the hard limit (containers often start with a
/// soft limit of 1,024 under a hard one of a million); returns (before, after). Each
/// connection is a descriptor, so the soft limit is the most clients a replica can hold.
pub fn raise_open_files_limit() -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit through a pointer to a live, writable one.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let before = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit reads one rlimit through a pointer to a live one.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok((before, limit.rlim_cur))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    const TIMEOUTS: Timeouts = Timeouts {
        handshake: Duration::from_millis(100),
        idle: Duration::from_millis(300),
    };

    /// A guarded server end and its client.
    async fn pair() -> (Guarded<Socket>, TcpStream) {
        pair_in(TIMEOUTS, &Handshaking::default()).await
    }

    /// [`pair`], held to `timeouts`, the connection enrolled in `handshaking`.
    async fn pair_in(
        timeouts: Timeouts,
        handshaking: &Handshaking,
    ) -> (Guarded<Socket>, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr"));
        let mut acceptor = Acceptor::new("test", listener, timeouts, handshaking.clone());
        let (server, client) = tokio::join!(acceptor.accept(), client);
        (server, client.expect("connect"))
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_speaks_is_closed_at_the_handshake_timeout() {
        let (mut server, _client) = pair().await;
        let start = Instant::now();
        let error = server.read(&mut [0; 16]).await.expect_err("timed out");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(error.to_string().contains("handshake"), "{error}");
        assert_eq!(start.elapsed(), TIMEOUTS.handshake);
    }

    #[tokio::test(start_paused = true)]
    async fn a_handshake_trickled_a_byte_at_a_time_is_cut_at_the_handshake_timeout() {
        let (mut server, mut client) = pair().await;
        let start = Instant::now();
        let mut buf = [0; 16];
        let error = loop {
            client.write_all(b"P").await.expect("write");
            match server.read(&mut buf).await {
                Ok(read) => assert_eq!(read, 1),
                Err(error) => break error,
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        };
        assert!(error.to_string().contains("handshake"), "{error}");
        // Bytes came at 0, 30, 60 and 90 ms; the one at 120 ms is past the deadline.
        assert_eq!(start.elapsed(), Duration::from_millis(120));
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_keep_a_connection_open_and_silence_closes_it_after_the_idle_timeout() {
        let (mut server, mut client) = pair().await;
        let mut buf = [0; 64];
        client
            .write_all(&[b'x'; HANDSHAKE_BYTES])
            .await
            .expect("write");
        assert_eq!(server.read(&mut buf).await.expect("read"), HANDSHAKE_BYTES);
        // Bytes every 200 ms: past the handshake timeout, within the idle one.
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            client.write_all(b"x").await.expect("write");
            assert_eq!(server.read(&mut buf).await.expect("read"), 1);
        }
        let start = Instant::now();
        let error = server.read(&mut buf).await.expect_err("timed out");
        assert!(error.to_string().contains("idle"), "{error}");
        assert_eq!(start.elapsed(), TIMEOUTS.idle);
    }

    #[tokio::test(start_paused = true)]
    async fn making_room_closes_the_oldest_silent_connection_and_spares_the_others() {
        // A handshake timeout that leaves room for ROOM_MIN_AGE.
        let timeouts = Timeouts {
            handshake: ROOM_MIN_AGE * 10,
            ..TIMEOUTS
        };
        let handshaking = Handshaking::default();
        let (mut handshaken, mut its_client) = pair_in(timeouts, &handshaking).await;
        let (mut oldest, _client) = pair_in(timeouts, &handshaking).await;
        let mut buf = [0; 64];
        its_client
            .write_all(&[b'x'; HANDSHAKE_BYTES])
            .await
            .expect("write");
        assert_eq!(
            handshaken.read(&mut buf).await.expect("read"),
            HANDSHAKE_BYTES
        );
        assert!(!handshaking.close_oldest(), "too young to be closed");

        tokio::time::sleep(ROOM_MIN_AGE).await;
        let (mut newest, _other) = pair_in(timeouts, &handshaking).await;
        assert!(handshaking.close_oldest());
        let error = oldest.read(&mut buf).await.expect_err("closed");
        assert!(error.to_string().contains("to make room"), "{error}");
        // The newest is too young, and the one past its handshake is not among them.
        assert!(!handshaking.close_oldest());
        tokio::time::sleep(ROOM_MIN_AGE).await;
        assert!(handshaking.close_oldest());
        let error = newest.read(&mut buf).await.expect_err("closed");
        assert!(error.to_string().contains("to make room"), "{error}");
        assert!(!handshaking.close_oldest());
        its_client.write_all(b"x").await.expect("write");
        assert_eq!(handshaken.read(&mut buf).await.expect("read"), 1);
    }

    #[test]
    fn the_soft_open_files_limit_is_raised_to_the_hard_one() {
        let (before, after) = raise_open_files_limit().expect("rlimit");
        assert!(after >= before);
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as in raise_open_files_limit.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        assert_eq!(limit.rlim_cur, limit.rlim_max);
    }
}
