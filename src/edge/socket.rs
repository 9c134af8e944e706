//! What floodgate serves on: a TCP port or a Unix socket, one type each, so that one server
//! serves whichever the settings chose. What is served on them, guarded and maybe under TLS,
//! is `listener.rs`'.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

/// A bound listener.
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    /// Binds the Unix socket `path`. A socket file there is replaced only when nothing
    /// answers on it (one a previous run left): a path another process is serving on is
    /// refused, since replacing it would leave that process running where no client can
    /// reach it. Anything else at the path is an error, never removed.
    pub async fn bind_unix(path: &Path) -> io::Result<Listener> {
        use std::os::unix::fs::FileTypeExt;
        if let Ok(metadata) = std::fs::symlink_metadata(path)
            && metadata.file_type().is_socket()
        {
            if in_use(path).await? {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("another process is serving on {}", path.display()),
                ));
            }
            // Gone meanwhile is as good as removed.
            if let Err(e) = std::fs::remove_file(path)
                && e.kind() != io::ErrorKind::NotFound
            {
                return Err(e);
            }
        }
        UnixListener::bind(path).map(Listener::Unix)
    }

    pub fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Socket>> {
        match self {
            Listener::Tcp(listener) => listener.poll_accept(cx).map_ok(|(stream, _)| {
                // Small answers go out at once; a failure here only costs latency.
                let _ = stream.set_nodelay(true);
                Socket::Tcp(stream)
            }),
            Listener::Unix(listener) => listener
                .poll_accept(cx)
                .map_ok(|(stream, _)| Socket::Unix(stream)),
        }
    }
}

/// Whether a process is serving on the socket file `path`: it accepts a connection, or its
/// backlog is full (a non-blocking connect then fails with `EAGAIN`). `false` when the
/// connection is refused: the file outlived its process.
async fn in_use(path: &Path) -> io::Result<bool> {
    match UnixStream::connect(path).await {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(false),
        // Removed meanwhile: there is nothing to replace.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// An accepted connection.
pub enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// AsyncRead and AsyncWrite for an enum whose every variant has them.
macro_rules! delegate_io {
    ($type:ty, $($variant:ident),+) => {
        impl AsyncRead for $type {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $(Self::$variant(io) => Pin::new(io).poll_read(cx, buf),)+
                }
            }
        }

        impl AsyncWrite for $type {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $(Self::$variant(io) => Pin::new(io).poll_write(cx, buf),)+
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $(Self::$variant(io) => Pin::new(io).poll_flush(cx),)+
                }
            }

            fn poll_shutdown(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $(Self::$variant(io) => Pin::new(io).poll_shutdown(cx),)+
                }
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $(Self::$variant(io) => Pin::new(io).poll_write_vectored(cx, bufs),)+
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    $(Self::$variant(io) => io.is_write_vectored(),)+
                }
            }
        }
    };
}

pub(crate) use delegate_io;

delegate_io!(Socket, Tcp, Unix);
