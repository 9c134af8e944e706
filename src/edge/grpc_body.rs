//! What a request's body may make the server hold, and for how long.
//!
//! A body is read as it comes, frame by frame, and HTTP gives its sender room for more as
//! soon as a frame is read. So a client that announces a large message and sends it slowly
//! (or never finishes it) on many streams would have the server hold all of it until the
//! request timeout. Every gRPC call's body is therefore read through a [`LimitedBody`], and
//! every HTTP request's (`POST /json`, the admin API) through a plain one ([`plain_body`]):
//!
//! - **One message is at most its method's size** ([`MessageLimits`]): `ShouldRateLimit`'s
//!   largest valid request, derived from `request_limits`; an RLQS report 4 MiB; anything
//!   else 64 KiB. A larger one is refused when its 5-byte gRPC header announces it, before
//!   any of it is read, with `RESOURCE_EXHAUSTED` naming the limit. A unary call's second
//!   message is `INVALID_ARGUMENT`. (An HTTP body's size is its handler's to bound.)
//! - **What waits is charged to one process-wide budget** ([`HeldBytes`],
//!   `connection_limits.max_request_bytes_held`). A body that is whole when first read is
//!   never charged. One that must wait for more is charged, while it waits, for its headers
//!   ([`HEADER_COPIES`] times), a fixed [`STREAM_COST`] and its body as the server holds it
//!   (a message in progress counted as announced; a stream's message just completed
//!   [`DECODED`] times until it is dealt with). When a charge does not fit, waiting
//!   requests are cut (`RESOURCE_EXHAUSTED`; HTTP 503) until it does, those holding the most
//!   first (by powers of two), and of those the ones that have waited longest. A
//!   well-behaved call waits for its last bytes a moment (tonic's client sends the end of a
//!   unary call's stream just after its message) holding a few KiB; a client stalling
//!   bodies holds large ones, or small ones for seconds, so the stalled go first. A cut
//!   request's stream is reset, which frees what HTTP/2 buffered for it.
//! - **Unread bytes are bounded per connection** by HTTP/2's flow control
//!   (`grpc_conn.rs`): a stream may have [`STREAM_WINDOW`] bytes sent and not yet read, a
//!   connection [`CONNECTION_WINDOW`]. Bodies are read as soon as they come, so these
//!   bytes are in transit, not held.
//!
//! Bodies that stall are still dropped at the request timeout (`CallDeadline`).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::task::AtomicWaker;
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, SizeHint};
use prost::bytes::{Buf, Bytes};

use crate::settings::{ConnectionLimits, RequestLimits};

/// What a call is charged while it waits, beyond its headers and body: the state HTTP/2,
/// the server and the call's task keep for a stream (measured at about 10 KiB).
pub const STREAM_COST: usize = 16 << 10;

/// How many times a waiting call's headers count: HTTP/2 decodes them, the request holds
/// them, and gRPC's metadata and the call's span copy them (measured: 2,048 stalled calls
/// with 12 KiB of headers each took 81 MiB with the headers counted once).
pub const HEADER_COPIES: usize = 4;

/// How many times a stream's message counts while its handler works on it (see
/// `LimitedBody::holding`).
pub const DECODED: usize = 4;

/// Bytes a stream may have sent and not yet read (HTTP/2's initial stream window).
pub const STREAM_WINDOW: u32 = 1 << 20;

/// Bytes a connection may have sent and not yet read, over all its streams (HTTP/2's
/// connection window).
pub const CONNECTION_WINDOW: u32 = 2 << 20;

/// The most one RLQS report may be (gRPC's customary 4 MiB; Envoy's are a few KiB).
pub const MAX_REPORT_BYTES: usize = 4 << 20;

/// The most one message of any other method (health, reflection) may be.
pub const MAX_OTHER_MESSAGE_BYTES: usize = 64 << 10;

/// The gRPC header before each message: a compression flag and the length.
const GRPC_HEADER: usize = 5;

/// What the largest call holds while it waits: a `ShouldRateLimit` call with the largest
/// request `limits` allow, or an RLQS stream with the largest report while it is answered.
/// The budget must cover at least this, or such a call could never be received.
pub fn largest_waiting_call(limits: &RequestLimits) -> usize {
    let body = (limits.largest_request_bytes() + GRPC_HEADER)
        .max(DECODED * (MAX_REPORT_BYTES + GRPC_HEADER));
    body + HEADER_COPIES * MAX_HEADER_LIST_BYTES + STREAM_COST
}

/// Whether `connections.max_request_bytes_held` can hold the largest call `requests` allow
/// while it waits; why not.
pub fn check_budget(
    connections: &ConnectionLimits,
    requests: &RequestLimits,
) -> Result<(), String> {
    let largest = largest_waiting_call(requests);
    let most = connections.max_request_bytes_held;
    if most < largest {
        return Err(format!(
            "connection_limits.max_request_bytes_held ({most}) must be at least {largest}: the \
             largest request request_limits allow, with its headers and stream, could never be \
             received"
        ));
    }
    Ok(())
}

/// The most a call's headers may be (HTTP/2's `SETTINGS_MAX_HEADER_LIST_SIZE`, as hyper
/// advertises it by default).
pub const MAX_HEADER_LIST_BYTES: usize = 16 << 10;

/// Each method's largest message.
#[derive(Debug, Clone)]
pub struct MessageLimits {
    /// `ShouldRateLimit`: the largest request `request_limits` lets through.
    pub should_rate_limit: usize,
}

impl MessageLimits {
    pub fn new(limits: &RequestLimits) -> Self {
        MessageLimits {
            should_rate_limit: limits.largest_request_bytes(),
        }
    }

    /// What a call of `path` may send: its largest message, whether it is unary, and the
    /// method's name and why its limit is what it is, for the refusal.
    fn method(&self, path: &str) -> Method {
        match path.rsplit('/').next() {
            Some("ShouldRateLimit") => Method {
                largest: self.should_rate_limit,
                unary: true,
                why: "ShouldRateLimit's largest valid request (request_limits)",
                framed: true,
            },
            Some("StreamRateLimitQuotas") => Method {
                largest: MAX_REPORT_BYTES,
                unary: false,
                why: "an RLQS report's limit",
                framed: true,
            },
            _ => Method {
                largest: MAX_OTHER_MESSAGE_BYTES,
                unary: false,
                why: "the limit for this method",
                framed: true,
            },
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Method {
    largest: usize,
    unary: bool,
    why: &'static str,
    /// Whether the body is gRPC messages (else bytes, whose size the handler bounds).
    framed: bool,
}

/// The calls waiting for the rest of their request, across every connection: what each
/// holds, in the order they are cut in, and the most they may hold together.
#[derive(Debug)]
pub struct HeldBytes {
    most: usize,
    waiting: Mutex<Waiting>,
}

#[derive(Debug, Default)]
struct Waiting {
    /// What the calls below hold together.
    held: usize,
    /// Each waiting call by its [`Place`]: what it holds, and how to cut it.
    calls: BTreeMap<Place, (usize, Arc<Cut>)>,
    next: u64,
}

/// A waiting call's place in the order calls are cut in: the largest first (by the power of
/// two they hold: a call stalling a large body before a small one waiting for its last
/// bytes), and of those the one that began waiting first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Place {
    size: std::cmp::Reverse<u32>,
    since: u64,
}

impl Place {
    fn of(bytes: usize, since: u64) -> Self {
        Place {
            size: std::cmp::Reverse(usize::BITS - bytes.leading_zeros()),
            since,
        }
    }
}

/// How a waiting call is told it was cut to make room: a flag, and its task to wake.
#[derive(Debug, Default)]
struct Cut {
    cut: AtomicBool,
    waker: AtomicWaker,
}

impl HeldBytes {
    pub fn new(most: usize) -> Self {
        HeldBytes {
            most,
            waiting: Mutex::default(),
        }
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.lock().held
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Charges the waiting call at `place` (a new one, when `None`) for holding `bytes`
    /// from now on. When that passes the most, calls are cut in [`Place`]'s order, never
    /// this one, until it fits. The call's new place, or `None` when it alone is past the
    /// most.
    fn charge(&self, place: Option<Place>, bytes: usize, cut: &Arc<Cut>) -> Option<Place> {
        let mut waiting = self.lock();
        let (since, before) =
            match place.and_then(|place| Some((place, waiting.calls.remove(&place)?))) {
                Some((place, (before, _))) => (place.since, before),
                None => {
                    waiting.next += 1;
                    (waiting.next, 0)
                }
            };
        waiting.held -= before;
        if bytes > self.most {
            return None;
        }
        while waiting.held + bytes > self.most {
            let (_, (held, first)) = waiting.calls.pop_first()?;
            waiting.held -= held;
            first.cut.store(true, Ordering::Release);
            first.waker.wake();
        }
        let place = Place::of(bytes, since);
        waiting.held += bytes;
        waiting.calls.insert(place, (bytes, cut.clone()));
        Some(place)
    }

    /// The call at `place` waits no more: what it held is free.
    fn release(&self, place: Place) {
        let mut waiting = self.lock();
        if let Some((held, _)) = waiting.calls.remove(&place) {
            waiting.held -= held;
        }
    }
}

/// How the message of a call cut to make room begins.
const CUT: &str = "the server holds at most";

/// Whether `status` is a call cut to make room for others (not one that broke a limit of
/// its own): the caller may try again at once.
pub fn is_cut(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::ResourceExhausted && status.message().starts_with(CUT)
}

/// A tower layer's service: every request's body read through a [`LimitedBody`].
#[derive(Clone)]
pub struct LimitBodies<S> {
    pub inner: S,
    pub limits: Arc<MessageLimits>,
    pub held: Arc<HeldBytes>,
}

impl<S, B> tower::Service<http::Request<B>> for LimitBodies<S>
where
    S: tower::Service<http::Request<LimitedBody<B>>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = self.limits.method(request.uri().path());
        let fixed = fixed_cost(request.headers());
        let held = self.held.clone();
        let request = request.map(|body| LimitedBody::new(body, method, fixed, held));
        self.inner.call(request)
    }
}

/// What a waiting request is charged beyond its body: its headers, as HTTP/2 counts a
/// header list's size (each field's name and value, and 32 bytes), [`HEADER_COPIES`] times,
/// and its stream's state.
fn fixed_cost(headers: &http::HeaderMap) -> usize {
    let headers: usize = (headers.iter())
        .map(|(name, value)| name.as_str().len() + value.len() + 32)
        .sum();
    HEADER_COPIES * headers + STREAM_COST
}

/// An HTTP request's body (`POST /json`, the admin API) read under the same budget as gRPC
/// calls': while it waits for more, it is charged its headers, state and every byte so far
/// (its handler's size limit bounds the body itself).
pub fn plain_body<B>(
    request: http::Request<B>,
    held: &Arc<HeldBytes>,
) -> http::Request<LimitedBody<B>> {
    let fixed = fixed_cost(request.headers());
    let method = Method {
        largest: usize::MAX,
        unary: true,
        why: "",
        framed: false,
    };
    request.map(|body| LimitedBody::new(body, method, fixed, held.clone()))
}

/// Where a body's reading is in its gRPC framing.
#[derive(Debug, Default)]
struct Reader {
    /// The current message's header, as far as it came.
    header: [u8; GRPC_HEADER],
    header_bytes: usize,
    /// The current message's bytes still to come; `None` while its header is.
    remaining: Option<usize>,
    /// Messages received whole.
    messages: usize,
    /// Bytes received, and of those the current message's (its header included).
    received: usize,
    in_message: usize,
    /// Bytes of the messages completed since [`Reader::handed_on`] was last called: what
    /// the call's handler is working on.
    completed: usize,
}

impl Reader {
    /// The handler asks for more: the messages completed so far have been dealt with.
    fn handed_on(&mut self) {
        self.completed = 0;
    }

    /// The message in progress as the server holds it: its header so far, or once the
    /// header is whole, the header and every byte it announces.
    fn current_message(&self) -> usize {
        match self.remaining {
            None => self.header_bytes,
            Some(remaining) => self.in_message + remaining,
        }
    }

    /// Reads `data` on: an error for a message larger than `method`'s or a unary call's
    /// second.
    fn read(&mut self, mut data: &[u8], method: &Method) -> Result<(), tonic::Status> {
        self.received += data.len();
        if !method.framed {
            return Ok(());
        }
        while !data.is_empty() {
            match self.remaining {
                None => {
                    if self.messages > 0 && method.unary {
                        return Err(tonic::Status::invalid_argument(
                            "a unary call carries one message; a second one came",
                        ));
                    }
                    let take = (GRPC_HEADER - self.header_bytes).min(data.len());
                    self.header[self.header_bytes..][..take].copy_from_slice(&data[..take]);
                    self.header_bytes += take;
                    self.in_message += take;
                    data = &data[take..];
                    if self.header_bytes == GRPC_HEADER {
                        let length = (&self.header[1..]).get_u32() as usize;
                        if length > method.largest {
                            return Err(tonic::Status::resource_exhausted(format!(
                                "the message is {length} bytes; at most {} are allowed ({})",
                                method.largest, method.why
                            )));
                        }
                        self.remaining = Some(length);
                    }
                }
                Some(remaining) => {
                    let take = remaining.min(data.len());
                    data = &data[take..];
                    self.in_message += take;
                    self.remaining = Some(remaining - take);
                }
            }
            if self.remaining == Some(0) {
                self.messages += 1;
                self.completed += self.in_message;
                self.remaining = None;
                self.header_bytes = 0;
                self.in_message = 0;
            }
        }
        Ok(())
    }
}

/// A request body read through the limits above: its messages' sizes checked as their
/// headers come, and what it holds while it waits charged to the process-wide budget.
pub struct LimitedBody<B> {
    inner: B,
    method: Method,
    reader: Reader,
    /// What the call is charged while waiting, beyond its body: headers and stream state.
    fixed: usize,
    held: Arc<HeldBytes>,
    /// Its place among the waiting calls, once it has waited for more of its body (before,
    /// it is charged nothing).
    waiting: Option<Place>,
    /// How it is told it was cut to make room for another waiting call: made when it first
    /// waits (a call whose body comes at once never needs one).
    cut: Option<Arc<Cut>>,
    /// What it held when last charged.
    charged: usize,
}

impl<B> LimitedBody<B> {
    fn new(inner: B, method: Method, fixed: usize, held: Arc<HeldBytes>) -> Self {
        LimitedBody {
            inner,
            method,
            reader: Reader::default(),
            fixed,
            held,
            waiting: None,
            cut: None,
            charged: 0,
        }
    }

    /// What the call holds while it waits: its headers and state, and of its body what the
    /// server keeps (a unary call's all, for its message is handed on only at the end; a
    /// stream's message in progress), a message in progress counted whole: its reader
    /// (tonic's) makes room for all of it once the header says how long it is, and that
    /// room is resident memory (measured: 384 streams announcing 1 MiB and sending 10 bytes
    /// each took the server to 484 MiB).
    ///
    /// A stream's message just completed counts [`DECODED`] times until its handler asks
    /// for the next: decoded, and answered, it is held several times over (an RLQS report's
    /// bucket ids come back in its answer).
    fn holding(&self) -> usize {
        let message = self.reader.current_message();
        let body = if self.method.unary {
            self.reader.received.max(message)
        } else {
            message + DECODED * self.reader.completed
        };
        self.fixed + body
    }

    /// Charges the call for what it holds now, cutting others (the largest, then the
    /// longest waiting) if the budget needs room; `RESOURCE_EXHAUSTED` when this call was
    /// cut, or alone holds more than the budget.
    fn charge(&mut self) -> Result<(), tonic::Status> {
        if (self.cut.as_ref()).is_some_and(|cut| cut.cut.load(Ordering::Acquire)) {
            return Err(self.refusal(
                "it held the most (or as much, and had waited longest), and newer calls \
                 needed the room",
            ));
        }
        let holding = self.holding();
        if self.waiting.is_some() && holding == self.charged {
            return Ok(());
        }
        let cut = self.cut.get_or_insert_with(Arc::default);
        self.waiting = self.held.charge(self.waiting, holding, cut);
        self.charged = holding;
        match self.waiting {
            Some(_) => Ok(()),
            None => Err(self.refusal("it alone would hold more")),
        }
    }

    fn refusal(&self, why: &str) -> tonic::Status {
        tonic::Status::resource_exhausted(format!(
            "{CUT} {} bytes of unfinished requests across connections \
             (connection_limits.max_request_bytes_held), and this call was cut: {why}; \
             it held {} bytes. Try again",
            self.held.most, self.charged
        ))
    }

    fn release(&mut self) {
        if let Some(call) = self.waiting.take() {
            self.held.release(call);
        }
    }
}

impl<B> Drop for LimitedBody<B> {
    fn drop(&mut self) {
        self.release();
    }
}

impl<B> Body for LimitedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        if let Some(cut) = &this.cut {
            cut.waker.register(cx.waker());
        }
        this.reader.handed_on();
        if this.waiting.is_some()
            && let Err(cut) = this.charge()
        {
            return Poll::Ready(Some(Err(cut)));
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        let Poll::Ready(frame) = polled else {
            // The call waits for more of its body: from now on it is charged for what it
            // holds, and may be cut (which wakes it).
            (this.cut.get_or_insert_with(Arc::default).waker).register(cx.waker());
            if let Err(cut) = this.charge() {
                return Poll::Ready(Some(Err(cut)));
            }
            return Poll::Pending;
        };
        let Some(frame) = frame else {
            this.release();
            return Poll::Ready(None);
        };
        let frame = frame.map_err(|error| tonic::Status::from_error(error.into()))?;
        if let Some(data) = frame.data_ref()
            && let Err(refused) = this.reader.read(data, &this.method)
        {
            return Poll::Ready(Some(Err(refused)));
        }
        if this.waiting.is_some()
            && let Err(cut) = this.charge()
        {
            return Poll::Ready(Some(Err(cut)));
        }
        if this.inner.is_end_stream() {
            this.release();
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn method(largest: usize, unary: bool) -> Method {
        Method {
            largest,
            unary,
            why: "test",
            framed: true,
        }
    }

    fn framed(length: u32, body: &[u8]) -> Vec<u8> {
        let mut framed = vec![0];
        framed.extend_from_slice(&length.to_be_bytes());
        framed.extend_from_slice(body);
        framed
    }

    #[test]
    fn a_message_past_the_limit_is_refused_at_its_header_split_anywhere() {
        let message = framed(101, &[]);
        for split in 0..=message.len() {
            let mut reader = Reader::default();
            let (first, second) = message.split_at(split);
            let result = (reader.read(first, &method(100, true)))
                .and_then(|()| reader.read(second, &method(100, true)));
            let refused = result.expect_err("101 bytes of 100");
            assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
            assert!(refused.message().contains("at most 100"), "{refused:?}");
        }
    }

    #[test]
    fn messages_are_followed_across_any_split() {
        let mut body = framed(3, b"abc");
        body.extend(framed(0, b""));
        body.extend(framed(2, b"de"));
        for split in 0..=body.len() {
            let mut reader = Reader::default();
            let (first, second) = body.split_at(split);
            reader.read(first, &method(3, false)).expect("in limits");
            reader.read(second, &method(3, false)).expect("in limits");
            assert_eq!(reader.messages, 3);
            assert_eq!(reader.in_message, 0);
            assert_eq!(reader.received, body.len());
        }
    }

    #[test]
    fn a_partial_message_is_what_a_stream_holds() {
        let mut reader = Reader::default();
        reader
            .read(&framed(10, b"abcd"), &method(10, false))
            .unwrap();
        assert_eq!((reader.in_message, reader.current_message()), (9, 15));
        reader.read(b"efghij", &method(10, false)).unwrap();
        assert_eq!((reader.in_message, reader.messages), (0, 1));
    }

    #[test]
    fn a_unary_call_takes_one_message() {
        let mut reader = Reader::default();
        reader.read(&framed(1, b"a"), &method(10, true)).unwrap();
        let refused = reader.read(&[0], &method(10, true)).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn the_largest_calls_then_the_longest_waiting_are_cut_to_make_room() {
        let held = HeldBytes::new(100);
        let cuts: Vec<Arc<Cut>> = (0..5).map(|_| Arc::default()).collect();
        let cut = |i: usize| cuts[i].cut.load(Ordering::Acquire);
        let small = held.charge(None, 5, &cuts[0]).expect("room");
        let first = held.charge(None, 40, &cuts[1]).expect("room");
        let second = held.charge(None, 40, &cuts[2]).expect("room");
        // A new call needs room: the first of the two large ones goes, not the small one
        // that has waited longer.
        let third = held.charge(None, 30, &cuts[3]).expect("room");
        assert!(cut(1) && !cut(0) && !cut(2));
        assert_eq!(held.held(), 75);
        // A call grows: the largest other one goes, never itself; it keeps its age.
        let grown = held.charge(Some(third), 90, &cuts[3]).expect("room");
        assert_eq!(grown.since, third.since);
        assert!(cut(2) && !cut(0));
        assert_eq!(held.held(), 95);
        // One alone past the most is refused, and cuts nobody.
        assert_eq!(held.charge(None, 101, &cuts[4]), None);
        assert!(!cut(3) && !cut(0));
        for place in [small, first, second, grown] {
            held.release(place);
        }
        assert_eq!(held.held(), 0);
    }
}
