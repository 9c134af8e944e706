//! Any gRPC client on the Unix socket. gRPC's C core (Python's grpcio, and the C++, Ruby and
//! PHP libraries) names a Unix socket's peer in `:authority` as the socket's path,
//! percent-encoded (`%2Frun%2Ffloodgate%2Fgrpc.sock`). That is no authority (`/` and `%`
//! have no place in a host), and h2 resets every stream that carries one (PROTOCOL_ERROR,
//! which the client reports as INTERNAL) before floodgate sees the call.
//!
//! On a Unix-socket connection, [`UnixAuthority`] reads the client's header blocks on their
//! way to h2. A block whose `:authority` h2 would refuse goes on with `localhost` instead
//! (what grpc-go sends on a Unix socket; on a socket the authority names nothing). Every
//! other byte, and every block before the first rewritten one, passes unchanged: until a
//! block must be rewritten, the client's bytes are read straight into h2's own buffer and
//! walked where they lie (only a frame header or header block split across reads is
//! held back until whole), so a client such as Envoy, whose authority is valid, costs the
//! decoding of its header blocks and no copy or extra read.
//!
//! HPACK compresses a connection's header blocks against a table both ends keep, so a
//! rewritten block cannot be spliced into the client's stream as it is: the client's blocks
//! are all decoded here (keeping the client's table), and from the first rewritten one on,
//! each is sent to h2 again as literals that never touch h2's table. A block is held until
//! its last frame came, at most [`MAX_BLOCK_BYTES`]; a larger one closes the connection
//! (h2 would refuse its header list anyway: `grpc_body::MAX_HEADER_LIST_BYTES`). What the
//! connections hold of unfinished blocks together is bounded too, by [`MAX_HELD_BYTES`]:
//! the connection whose bytes would pass it is closed. Other frames pass as they are read,
//! a few KiB at a time.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// HTTP/2's connection preface, which the client sends before its first frame.
const PREFACE_BYTES: usize = 24;
/// A frame's header: length (24 bits), type, flags, stream (31 bits).
const FRAME_HEAD_BYTES: usize = 9;
/// The largest frame h2 takes from a client (`grpc_conn`'s `max_frame_size`), and so the
/// largest this sends it.
const MAX_FRAME_BYTES: usize = 16 << 10;
/// The most bytes of one header block (its frames) held until it is whole: a header list
/// h2 takes (16 KiB) and its frames' overhead.
pub const MAX_BLOCK_BYTES: usize = 20 << 10;
/// The most bytes every connection's unfinished header blocks hold together (their frames,
/// their fragments and the frame being read).
pub const MAX_HELD_BYTES: usize = 8 << 20;
/// The most a read from the socket brings at once.
const READ_BYTES: usize = 4 << 10;

/// What the connections' unfinished header blocks hold now.
static HELD: AtomicUsize = AtomicUsize::new(0);
/// The dynamic table h2 lets a client's encoder use (HTTP/2's default, which h2 keeps).
const TABLE_BYTES: usize = 4096;
/// What an authority h2 would refuse becomes.
const STANDIN: &[u8] = b"localhost";

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// A connection whose client header blocks are mended for h2 when `mend` is set (a Unix
/// socket's); otherwise the connection itself.
pub struct UnixAuthority<IO> {
    io: IO,
    mender: Option<Box<Mender>>,
}

impl<IO> UnixAuthority<IO> {
    pub fn new(io: IO, mend: bool) -> Self {
        UnixAuthority {
            io,
            mender: mend.then(|| Box::new(Mender::new())),
        }
    }
}

/// The client's bytes on their way to h2: parsed frame by frame, header blocks decoded.
struct Mender {
    /// Read from the client, not yet parsed.
    input: Vec<u8>,
    /// Ready for h2, from `sent` on.
    output: Vec<u8>,
    sent: usize,
    state: State,
    /// The client's HPACK table, kept by decoding every block.
    decoder: httlib_hpack::Decoder<'static>,
    /// A block's fragment as the decoder takes it (it consumes a vector), and the fields it
    /// gives, both kept from block to block.
    fragment: Vec<u8>,
    decoded: Vec<(Vec<u8>, Vec<u8>, u8)>,
    /// Whether a block was rewritten: from then on h2's table no longer matches the
    /// client's, and every block goes as literals.
    rewriting: bool,
    /// The header frame being read, whole when `state` leaves [`State::Gathering`].
    frame: Vec<u8>,
    /// The block last decoded.
    fields: Fields,
    block: Option<Block>,
    /// What this connection counts in [`HELD`].
    held: usize,
    ended: bool,
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// Before the first frame: this many bytes of the preface to pass.
    Preface(usize),
    /// At a frame's header.
    Head,
    /// Within a frame that passes as it is: this many bytes left.
    Passing(usize),
    /// Within a header frame, gathered into `frame`: this many bytes left.
    Gathering(usize),
}

/// A header block being gathered: its frames as the client sent them, and its fragments.
struct Block {
    frames: Vec<u8>,
    fragment: Vec<u8>,
    stream: u32,
    end_stream: bool,
    /// The HEADERS frame's priority fields, when it had them.
    priority: Option<[u8; 5]>,
}

impl Mender {
    fn new() -> Self {
        let decoder = httlib_hpack::Decoder::with_dynamic_size(TABLE_BYTES as u32);
        Mender {
            input: Vec::new(),
            output: Vec::new(),
            sent: 0,
            state: State::Preface(PREFACE_BYTES),
            decoder,
            fragment: Vec::new(),
            decoded: Vec::new(),
            rewriting: false,
            frame: Vec::new(),
            fields: Fields::default(),
            block: None,
            held: 0,
            ended: false,
        }
    }

    /// Moves what `input` holds to `output` as far as it can, then counts what is held
    /// for unfinished blocks.
    fn advance(&mut self) -> io::Result<()> {
        let moved = self.pass();
        let block = self
            .block
            .as_ref()
            .map_or(0, |b| b.frames.len() + b.fragment.len());
        self.hold(self.frame.len() + block)?;
        moved
    }

    /// Counts `bytes` held for this connection's unfinished block in [`HELD`]; an error
    /// when that passes [`MAX_HELD_BYTES`].
    fn hold(&mut self, bytes: usize) -> io::Result<()> {
        let before = self.held;
        self.held = bytes;
        if bytes <= before {
            HELD.fetch_sub(before - bytes, Ordering::Relaxed);
            return Ok(());
        }
        let total = HELD.fetch_add(bytes - before, Ordering::Relaxed) + bytes - before;
        if total > MAX_HELD_BYTES {
            return Err(invalid(
                "header blocks of Unix-socket clients hold over 8 MiB together",
            ));
        }
        Ok(())
    }

    /// Moves what `input` holds, as far as it is whole, to `output`.
    fn pass(&mut self) -> io::Result<()> {
        let mut at = 0;
        let passed = loop {
            let rest = &self.input[at..];
            match self.state {
                State::Preface(left) | State::Passing(left) if left > 0 => {
                    let take = left.min(rest.len());
                    if take == 0 {
                        break Ok(());
                    }
                    self.output.extend_from_slice(&rest[..take]);
                    at += take;
                    self.state = match self.state {
                        State::Preface(_) => State::Preface(left - take),
                        _ => State::Passing(left - take),
                    };
                }
                State::Preface(_) | State::Passing(_) => self.state = State::Head,
                State::Gathering(left) => {
                    let take = left.min(rest.len());
                    self.frame.extend_from_slice(&rest[..take]);
                    at += take;
                    if take < left {
                        self.state = State::Gathering(left - take);
                        break Ok(());
                    }
                    let frame = std::mem::take(&mut self.frame);
                    self.state = State::Head;
                    if let Err(error) = self.header_frame(&frame) {
                        break Err(error);
                    }
                }
                State::Head => {
                    let Some(head) = rest.get(..FRAME_HEAD_BYTES) else {
                        break Ok(());
                    };
                    let read = Head::read(head);
                    if !read.is_header_block() {
                        // Not a header block's (or one h2 refuses for its size).
                        self.output.extend_from_slice(head);
                        at += FRAME_HEAD_BYTES;
                        self.state = State::Passing(read.length);
                        continue;
                    }
                    self.frame.extend_from_slice(head);
                    at += FRAME_HEAD_BYTES;
                    self.state = State::Gathering(read.length);
                }
            }
        };
        self.input.drain(..at);
        if self.input.is_empty() && self.input.capacity() > 2 * READ_BYTES {
            self.input = Vec::new();
        }
        passed
    }

    /// Takes a HEADERS or CONTINUATION frame (header and payload); a block's last frame
    /// sends it on.
    fn header_frame(&mut self, frame: &[u8]) -> io::Result<()> {
        let (head, payload) = frame.split_at(FRAME_HEAD_BYTES);
        let Head {
            kind,
            flags,
            stream,
            ..
        } = Head::read(head);
        if kind == HEADERS {
            if self.block.is_some() {
                return Err(invalid("a HEADERS frame within another header block"));
            }
            let (fragment, priority) = headers_fragment(flags, payload)?;
            self.block = Some(Block {
                frames: Vec::new(),
                fragment: Vec::new(),
                stream,
                end_stream: flags & END_STREAM != 0,
                priority,
            });
            self.gather(frame, fragment)?;
        } else {
            if self
                .block
                .as_ref()
                .is_none_or(|block| block.stream != stream)
            {
                return Err(invalid("a CONTINUATION frame outside its header block"));
            }
            self.gather(frame, payload)?;
        }
        if flags & END_HEADERS != 0 {
            let block = self.block.take().expect("a block is being gathered");
            self.send_block(block)?;
        }
        Ok(())
    }

    fn gather(&mut self, frame: &[u8], fragment: &[u8]) -> io::Result<()> {
        let block = self.block.as_mut().expect("a block is being gathered");
        if block.frames.len() + frame.len() > MAX_BLOCK_BYTES {
            return Err(invalid("a header block over 20 KiB"));
        }
        block.frames.extend_from_slice(frame);
        block.fragment.extend_from_slice(fragment);
        Ok(())
    }

    /// Decodes `block` against the client's table; sends it on as it came, or as literals
    /// with its authority mended.
    fn send_block(&mut self, block: Block) -> io::Result<()> {
        self.decode(&block.fragment)?;
        if !self.rewriting {
            self.output.extend_from_slice(&block.frames);
            return Ok(());
        }
        let literals = self.fields.literals();
        frames(&block, &literals, &mut self.output);
        Ok(())
    }

    /// Decodes a block's `fragment` into `fields` against the client's table, its
    /// authority mended; from a block whose authority needed it on, `rewriting`.
    fn decode(&mut self, fragment: &[u8]) -> io::Result<()> {
        let fields = &mut self.fields;
        fields.clear();
        self.fragment.clear();
        self.fragment.extend_from_slice(fragment);
        self.decoded.clear();
        (self.decoder)
            .decode(&mut self.fragment, &mut self.decoded)
            .map_err(|error| invalid(&format!("a header block HPACK cannot decode: {error:?}")))?;
        for (name, value, _) in &self.decoded {
            fields.push(name, value);
        }
        if fields.mended && !self.rewriting {
            tracing::debug!("a Unix-socket client's :authority is no authority; sending localhost");
        }
        self.rewriting |= fields.mended;
        Ok(())
    }

    /// Walks `read`, bytes just read into h2's own buffer while nothing is being rewritten:
    /// frames pass where they lie, and each whole header block in them is decoded in place
    /// (the client's table kept). Returns how many bytes go to h2 as they are; from there
    /// on (a frame header or a header block not whole in `read`, or a block whose authority
    /// was mended, which is then in `output`) the bytes are this one's to pass.
    fn observe(&mut self, read: &[u8]) -> io::Result<usize> {
        if read.is_empty() {
            return Ok(0);
        }
        let mut at = 0;
        loop {
            let rest = &read[at..];
            match self.state {
                State::Preface(left) | State::Passing(left) if left > 0 => {
                    let take = left.min(rest.len());
                    if take == 0 {
                        return Ok(self.stash(read, at));
                    }
                    at += take;
                    self.state = match self.state {
                        State::Preface(_) => State::Preface(left - take),
                        _ => State::Passing(left - take),
                    };
                }
                State::Preface(_) | State::Passing(_) => self.state = State::Head,
                State::Gathering(_) => return Ok(self.stash(read, at)),
                State::Head => {
                    let Some(head) = rest.get(..FRAME_HEAD_BYTES) else {
                        return Ok(self.stash(read, at));
                    };
                    let head = Head::read(head);
                    let Head {
                        length,
                        kind,
                        flags,
                        stream,
                    } = head;
                    if !head.is_header_block() {
                        at += FRAME_HEAD_BYTES;
                        self.state = State::Passing(length);
                        continue;
                    }
                    let whole = rest.get(..FRAME_HEAD_BYTES + length);
                    let Some(frame) = whole.filter(|_| kind == HEADERS && flags & END_HEADERS != 0)
                    else {
                        // A block not whole here: gathered until it is.
                        return Ok(self.stash(read, at));
                    };
                    let (fragment, priority) = headers_fragment(flags, &frame[FRAME_HEAD_BYTES..])?;
                    self.decode(fragment)?;
                    if self.rewriting {
                        let block = Block {
                            frames: Vec::new(),
                            fragment: Vec::new(),
                            stream,
                            end_stream: flags & END_STREAM != 0,
                            priority,
                        };
                        let literals = self.fields.literals();
                        frames(&block, &literals, &mut self.output);
                        // The frame is passed mended; what follows it, by `pass`.
                        self.input.extend_from_slice(&rest[frame.len()..]);
                        return Ok(at);
                    }
                    at += frame.len();
                }
            }
        }
    }

    /// `read` from `at` on, taken to be passed by [`Mender::pass`]; `at`.
    fn stash(&mut self, read: &[u8], at: usize) -> usize {
        self.input.extend_from_slice(&read[at..]);
        at
    }

    /// Whether the next bytes may be read straight into h2's buffer and walked there:
    /// nothing is held, pending or being rewritten.
    fn observing(&self) -> bool {
        !self.rewriting
            && self.input.is_empty()
            && self.sent >= self.output.len()
            && self.frame.is_empty()
            && self.block.is_none()
            && !matches!(self.state, State::Gathering(_))
    }
}

/// A header block's fields, decoded into one buffer (no allocation per field), its
/// authority mended.
#[derive(Default)]
struct Fields {
    bytes: Vec<u8>,
    /// Where each field's name ends and its value ends, in `bytes`.
    ends: Vec<(usize, usize)>,
    /// Whether an authority h2 would refuse was replaced.
    mended: bool,
}

impl Fields {
    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
        self.mended = false;
    }

    fn push(&mut self, name: &[u8], value: &[u8]) {
        let value = if name == b":authority" && !is_authority(value) {
            self.mended = true;
            STANDIN
        } else {
            value
        };
        self.bytes.extend_from_slice(name);
        let name_end = self.bytes.len();
        self.bytes.extend_from_slice(value);
        self.ends.push((name_end, self.bytes.len()));
    }

    /// The fields as literals never indexed.
    fn literals(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.bytes.len() + 4 * self.ends.len());
        let mut start = 0;
        for &(name_end, value_end) in &self.ends {
            literal(
                &self.bytes[start..name_end],
                &self.bytes[name_end..value_end],
                &mut out,
            );
            start = value_end;
        }
        out
    }
}

/// Whether h2 takes `value` as an authority. Host names, addresses and ports are checked
/// without allocating; anything else (a `%`, a `/`, user info) as h2 checks it.
fn is_authority(value: &[u8]) -> bool {
    let plain = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'_');
    (!value.is_empty() && value.iter().all(plain)) || http::uri::Authority::try_from(value).is_ok()
}

/// A frame's header, read.
#[derive(Debug, Clone, Copy)]
struct Head {
    length: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

impl Head {
    /// The frame header `bytes` (at least [`FRAME_HEAD_BYTES`]) hold.
    fn read(bytes: &[u8]) -> Head {
        Head {
            length: usize::from(bytes[0]) << 16
                | usize::from(bytes[1]) << 8
                | usize::from(bytes[2]),
            kind: bytes[3],
            flags: bytes[4],
            stream: u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff,
        }
    }

    /// Whether the frame carries part of a header block this reads (one past the largest
    /// frame h2 takes is passed for h2 to refuse).
    fn is_header_block(self) -> bool {
        (self.kind == HEADERS || self.kind == CONTINUATION) && self.length <= MAX_FRAME_BYTES
    }
}

/// A HEADERS payload's fragment (padding and priority fields taken off), and its priority.
fn headers_fragment(flags: u8, payload: &[u8]) -> io::Result<(&[u8], Option<[u8; 5]>)> {
    let mut fragment = payload;
    let mut padding = 0;
    if flags & PADDED != 0 {
        let (&length, rest) = fragment
            .split_first()
            .ok_or_else(|| invalid("no pad length"))?;
        padding = usize::from(length);
        fragment = rest;
    }
    let mut priority = None;
    if flags & PRIORITY != 0 {
        let fields = fragment
            .get(..5)
            .ok_or_else(|| invalid("no priority fields"))?;
        priority = Some(fields.try_into().expect("five bytes"));
        fragment = &fragment[5..];
    }
    let end = (fragment.len())
        .checked_sub(padding)
        .ok_or_else(|| invalid("padding longer than the frame"))?;
    Ok((&fragment[..end], priority))
}

/// One field as a literal never indexed (HPACK's `0001` form, no Huffman coding): it
/// leaves h2's table as it is.
fn literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x10);
    for text in [name, value] {
        integer(text.len(), 7, out);
        out.extend_from_slice(text);
    }
}

/// HPACK's integer with an `prefix`-bit prefix (its other bits zero).
fn integer(mut value: usize, prefix: u8, out: &mut Vec<u8>) {
    let limit = (1usize << prefix) - 1;
    if value < limit {
        out.push(value as u8);
        return;
    }
    out.push(limit as u8);
    value -= limit;
    while value >= 128 {
        out.push((value % 128 + 128) as u8);
        value /= 128;
    }
    out.push(value as u8);
}

/// `fragment` as `block`'s HEADERS frame, and CONTINUATION frames past the frame size.
fn frames(block: &Block, fragment: &[u8], out: &mut Vec<u8>) {
    let room = MAX_FRAME_BYTES - if block.priority.is_some() { 5 } else { 0 };
    let first = fragment.len().min(room);
    let (head, mut rest) = fragment.split_at(first);
    let mut flags = if block.end_stream { END_STREAM } else { 0 };
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    let mut payload = Vec::with_capacity(first + 5);
    if let Some(priority) = block.priority {
        flags |= PRIORITY;
        payload.extend_from_slice(&priority);
    }
    payload.extend_from_slice(head);
    frame(HEADERS, flags, block.stream, &payload, out);
    while !rest.is_empty() {
        let (this, after) = rest.split_at(rest.len().min(MAX_FRAME_BYTES));
        let flags = if after.is_empty() { END_HEADERS } else { 0 };
        frame(CONTINUATION, flags, block.stream, this, out);
        rest = after;
    }
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8], out: &mut Vec<u8>) {
    let length = payload.len() as u32;
    out.extend_from_slice(&length.to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("Unix-socket client: {what}"),
    )
}

impl Drop for Mender {
    fn drop(&mut self) {
        let _ = self.hold(0);
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for UnixAuthority<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(mender) = this.mender.as_deref_mut() else {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        };
        loop {
            if mender.sent < mender.output.len() {
                let ready = &mender.output[mender.sent..];
                let take = ready.len().min(buf.remaining());
                buf.put_slice(&ready[..take]);
                mender.sent += take;
                if mender.sent == mender.output.len() {
                    mender.output.clear();
                    mender.sent = 0;
                    if mender.output.capacity() > 2 * READ_BYTES {
                        mender.output = Vec::new();
                    }
                }
                return Poll::Ready(Ok(()));
            }
            if mender.ended {
                return Poll::Ready(Ok(()));
            }
            if mender.observing() {
                // h2's own buffer, as large as it asks: its reads batch as without this.
                let before = buf.filled().len();
                ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
                if buf.filled().len() == before {
                    mender.ended = true;
                    continue;
                }
                let keep = mender.observe(&buf.filled()[before..])?;
                buf.set_filled(before + keep);
                if !mender.input.is_empty() {
                    mender.advance()?;
                }
                if keep > 0 {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            let mut chunk = [0u8; READ_BYTES];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                mender.ended = true;
                continue;
            }
            mender.input.extend_from_slice(read.filled());
            mender.advance()?;
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for UnixAuthority<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    /// A client that sends `data` at most `chunk` bytes a read.
    struct Chunked {
        data: Vec<u8>,
        at: usize,
        chunk: usize,
    }

    impl AsyncRead for Chunked {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let n = (self.chunk)
                .min(self.data.len() - self.at)
                .min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.data[at..at + n]);
            self.at += n;
            Poll::Ready(Ok(()))
        }
    }

    /// What h2 receives of `input` sent `chunk` bytes at a time, h2 reading into a buffer
    /// of `room` bytes.
    fn mend_into(input: &[u8], chunk: usize, room: usize) -> io::Result<Vec<u8>> {
        let client = Chunked {
            data: input.to_vec(),
            at: 0,
            chunk,
        };
        let mut io = UnixAuthority::new(client, true);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut received = Vec::new();
        loop {
            let mut space = vec![0u8; room];
            let mut buf = ReadBuf::new(&mut space);
            match Pin::new(&mut io).poll_read(&mut cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Ok(received),
                Poll::Ready(Ok(())) => received.extend_from_slice(buf.filled()),
                Poll::Ready(Err(error)) => return Err(error),
                Poll::Pending => unreachable!("the client never waits"),
            }
        }
    }

    /// What h2 receives of `input` sent `chunk` bytes at a time, into h2's usual buffer.
    fn mend(input: &[u8], chunk: usize) -> io::Result<Vec<u8>> {
        mend_into(input, chunk, 8 << 10)
    }

    /// A client's connection: the preface, a SETTINGS frame, then for each of `calls` its
    /// HEADERS (encoded by one HPACK encoder, which indexes what it sends) and a DATA frame.
    fn client_bytes(calls: &[&[(&[u8], &[u8])]]) -> Vec<u8> {
        let mut out = PREFACE.to_vec();
        frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100], &mut out);
        let mut encoder = loona_hpack::Encoder::new();
        for (index, fields) in calls.iter().enumerate() {
            let stream = 2 * index as u32 + 1;
            let block = encoder.encode(fields.iter().copied());
            frame(HEADERS, END_HEADERS, stream, &block, &mut out);
            frame(0x0, END_STREAM, stream, b"\0\0\0\0\x05hello", &mut out);
        }
        out
    }

    /// The frames of `bytes` (after the preface): type, flags, stream, payload.
    fn frames_of(bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut rest = &bytes[PREFACE_BYTES..];
        let mut frames = Vec::new();
        while !rest.is_empty() {
            let length =
                usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
            frames.push((rest[3], rest[4], stream, rest[9..9 + length].to_vec()));
            rest = &rest[9 + length..];
        }
        frames
    }

    /// The header lists h2 decodes from `bytes`, with its own table.
    fn header_lists(bytes: &[u8]) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut decoder = loona_hpack::Decoder::new();
        let mut lists = Vec::new();
        let mut block = Vec::new();
        for (kind, flags, _, payload) in frames_of(bytes) {
            if kind == HEADERS {
                let (fragment, _) = headers_fragment(flags, &payload).unwrap();
                block = fragment.to_vec();
            } else if kind == CONTINUATION {
                block.extend_from_slice(&payload);
            } else {
                continue;
            }
            if flags & END_HEADERS != 0 {
                lists.push(decoder.decode(&block).expect("h2 decodes what it is sent"));
            }
        }
        lists
    }

    fn call(authority: &'static [u8]) -> Vec<(&'static [u8], &'static [u8])> {
        vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (
                b":path",
                b"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            ),
            (b":authority", authority),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ]
    }

    fn owned(fields: &[(&[u8], &[u8])]) -> Vec<(Vec<u8>, Vec<u8>)> {
        fields
            .iter()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect()
    }

    #[test]
    fn a_valid_authority_passes_byte_for_byte_at_every_read_size() {
        let first = call(b"floodgate");
        let input = client_bytes(&[&first, &first, &first]);
        for chunk in 1..=input.len() {
            assert_eq!(
                mend(&input, chunk).unwrap(),
                input,
                "read {chunk} bytes at a time"
            );
        }
    }

    #[test]
    fn a_unix_path_authority_becomes_localhost_in_every_call_at_every_read_size() {
        let c_core = call(b"%2Ftmp%2Ffloodgate.sock");
        // The second and third blocks refer to the first one's fields by index.
        let input = client_bytes(&[&c_core, &c_core, &call(b"other:1")]);
        let mended = owned(&call(b"localhost"));
        for (chunk, room) in (1..=input.len()).flat_map(|c| [(c, 1), (c, 10), (c, 8 << 10)]) {
            let output = mend_into(&input, chunk, room).unwrap();
            let lists = header_lists(&output);
            assert_eq!(
                lists,
                [mended.clone(), mended.clone(), owned(&call(b"other:1"))]
            );
            // The DATA frames pass as they came.
            let data: Vec<_> = (frames_of(&output).into_iter())
                .filter(|(kind, ..)| *kind == 0)
                .collect();
            assert_eq!(data.len(), 3);
            assert!(
                data.iter()
                    .all(|(_, flags, _, payload)| *flags == END_STREAM
                        && payload == b"\0\0\0\0\x05hello")
            );
        }
    }

    #[test]
    fn a_connection_whose_authority_turns_bad_is_mended_from_that_block_on() {
        let c_core = call(b"%2Fs");
        let input = client_bytes(&[&call(b"floodgate"), &c_core, &c_core]);
        let mended = owned(&call(b"localhost"));
        for (chunk, room) in (1..=input.len()).flat_map(|c| [(c, 7), (c, 8 << 10)]) {
            let output = mend_into(&input, chunk, room).unwrap();
            let lists = header_lists(&output);
            assert_eq!(
                lists,
                [owned(&call(b"floodgate")), mended.clone(), mended.clone()]
            );
            let unchanged = client_bytes(&[&call(b"floodgate")]);
            assert_eq!(
                &output[..unchanged.len()],
                unchanged,
                "the first call passes as it came"
            );
        }
    }

    /// Huffman-coded names and values, indexed as they go, as C core and h2 send them.
    #[test]
    fn huffman_coded_fields_as_real_clients_send_them_are_read_and_mended() {
        let mut encoder = httlib_hpack::Encoder::default();
        let flags = httlib_hpack::Encoder::HUFFMAN_NAME
            | httlib_hpack::Encoder::HUFFMAN_VALUE
            | httlib_hpack::Encoder::WITH_INDEXING
            | httlib_hpack::Encoder::BEST_FORMAT;
        let mut input = PREFACE.to_vec();
        let c_core = call(b"%2Frun%2Ffloodgate%2Fgrpc.sock");
        for stream in [1, 3, 5] {
            let mut block = Vec::new();
            for (name, value) in &c_core {
                let field = (name.to_vec(), value.to_vec(), flags);
                encoder.encode(field, &mut block).expect("encodes");
            }
            // A timeout that changes with every call, as grpc-timeout does: never indexed.
            let timeout = (
                b"grpc-timeout".to_vec(),
                format!("{stream}m").into_bytes(),
                0x3,
            );
            encoder.encode(timeout, &mut block).expect("encodes");
            frame(HEADERS, END_HEADERS, stream, &block, &mut input);
        }
        for chunk in [1, 5, 64, input.len()] {
            let lists = header_lists(&mend(&input, chunk).unwrap());
            assert_eq!(lists.len(), 3);
            for (list, stream) in lists.iter().zip([1, 3, 5]) {
                let mut expected = owned(&call(b"localhost"));
                expected.push((b"grpc-timeout".to_vec(), format!("{stream}m").into_bytes()));
                assert_eq!(*list, expected, "read {chunk} bytes at a time");
            }
        }
    }

    #[test]
    fn padding_priority_and_continuations_are_read_and_a_long_block_is_split() {
        let mut fields = call(b"%2Fs");
        let long = vec![b'v'; 17_000];
        fields.push((b"x-long", &long));
        let mut encoder = loona_hpack::Encoder::new();
        let block = encoder.encode(fields.iter().copied());
        let mut input = PREFACE.to_vec();
        // HEADERS with 3 bytes of padding and priority fields, the rest in CONTINUATIONs.
        let (head, rest) = block.split_at(100);
        let mut payload = vec![3];
        payload.extend_from_slice(&[0, 0, 0, 0, 15]);
        payload.extend_from_slice(head);
        payload.extend_from_slice(&[0, 0, 0]);
        frame(
            HEADERS,
            PADDED | PRIORITY | END_STREAM,
            1,
            &payload,
            &mut input,
        );
        let (middle, last) = rest.split_at(rest.len() / 2);
        frame(CONTINUATION, 0, 1, middle, &mut input);
        frame(CONTINUATION, END_HEADERS, 1, last, &mut input);
        let output = mend(&input, 4096).unwrap();
        let frames = frames_of(&output);
        assert_eq!(frames[0].0, HEADERS);
        assert_eq!(
            frames[0].1,
            END_STREAM | PRIORITY,
            "continued, so no END_HEADERS"
        );
        assert_eq!(&frames[0].3[..5], &[0, 0, 0, 0, 15]);
        assert!(
            frames
                .iter()
                .all(|(_, _, _, payload)| payload.len() <= MAX_FRAME_BYTES)
        );
        assert_eq!(frames.last().unwrap().1, END_HEADERS);
        let mut expected = owned(&call(b"localhost"));
        expected.push((b"x-long".to_vec(), long.clone()));
        assert_eq!(header_lists(&output), [expected]);
    }

    #[test]
    fn a_header_block_past_the_bound_closes_the_connection() {
        let mut input = PREFACE.to_vec();
        frame(HEADERS, 0, 1, &[0x82], &mut input);
        let filler = vec![0u8; MAX_FRAME_BYTES];
        for _ in 0..3 {
            frame(CONTINUATION, 0, 1, &filler, &mut input);
        }
        let error = mend(&input, 1 << 20).unwrap_err();
        assert!(error.to_string().contains("over 20 KiB"), "{error}");
    }

    #[test]
    fn unfinished_blocks_are_bounded_together_and_released_with_their_connections() {
        let mut input = PREFACE.to_vec();
        frame(HEADERS, 0, 1, &[0x82], &mut input);
        frame(CONTINUATION, 0, 1, &vec![0x82; MAX_FRAME_BYTES], &mut input);
        let mut open = Vec::new();
        let refused = loop {
            let mut mender = Mender::new();
            mender.input.extend_from_slice(&input);
            match mender.advance() {
                Ok(()) => open.push(mender),
                Err(error) => break error,
            }
            assert!(
                open.len() < 1_000,
                "no bound after {} connections",
                open.len()
            );
        };
        assert!(
            refused.to_string().contains("over 8 MiB together"),
            "{refused}"
        );
        let held = HELD.load(Ordering::Relaxed);
        assert!(held <= MAX_HELD_BYTES + 2 * MAX_BLOCK_BYTES, "{held}");
        assert!(
            open.len() >= MAX_HELD_BYTES / (3 * MAX_BLOCK_BYTES),
            "{}",
            open.len()
        );
        let ours: usize = open.iter().map(|mender| mender.held).sum();
        drop(open);
        // Other tests of this process may hold a block at this moment; a few KiB at most.
        let left = HELD.load(Ordering::Relaxed);
        assert!(
            left < ours / 100,
            "{left} of {ours} bytes left once the connections closed"
        );
    }

    #[test]
    fn a_block_hpack_cannot_decode_closes_the_connection() {
        let mut input = PREFACE.to_vec();
        // An index past both tables.
        frame(HEADERS, END_HEADERS, 1, &[0xff, 0x7f], &mut input);
        assert!(mend(&input, 64).is_err());
    }

    #[test]
    fn integers_take_their_prefix_then_seven_bits_a_byte() {
        let encoded = |value| {
            let mut out = Vec::new();
            integer(value, 7, &mut out);
            out
        };
        assert_eq!(encoded(10), [10]);
        assert_eq!(encoded(127), [127, 0]);
        assert_eq!(encoded(1337), [127, 186, 9]);
    }
}
