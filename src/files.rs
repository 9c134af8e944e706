//! Reading the operator's files: rule files, the xDS overlays file, certificates, keys and
//! CA bundles. Every one is read here, with the same three guarantees.
//!
//! - **Only a regular file is read.** The name is opened without waiting (`O_NONBLOCK`), so
//!   a FIFO put in a file's place cannot hold the reader until someone writes to it, and
//!   what was opened (symbolic links followed) is checked before a byte is read: a FIFO, a
//!   device such as `/dev/zero`, a socket or a directory is refused, naming what it is.
//! - **Never more than a cap.** At most one byte past the cap is read, and a file that
//!   holds more is refused naming the file and the cap, so a file that never ends, or one
//!   that grows while it is read, cannot take the memory.
//! - **Off the async workers.** [`read_off_runtime`] runs the read on tokio's blocking pool,
//!   so a slow disk never stalls the requests being decided.
//!
//! What the callers do with a refusal is theirs, and is the same everywhere: a file that
//! does not read at start-up stops the start; one that does not read later is logged,
//! naming the file and why, and what was in force stays.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// The cap on a PEM file (a certificate chain, a private key, a CA bundle): 4 MiB. The
/// largest public CA bundles take about 250 KB, a certificate chain a few KB.
pub const PEM_MAX_BYTES: u64 = 4 * 1024 * 1024;

/// A file that was not read: its name and why.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct FileError {
    pub path: PathBuf,
    pub problem: Unreadable,
}

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum Unreadable {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("it is {0}, not a regular file; only regular files are read")]
    NotAFile(&'static str),
    /// The file holds at least `size` bytes, more than `cap`.
    #[error("it holds {size} bytes or more, over the cap of {cap} bytes")]
    TooBig { size: u64, cap: u64 },
}

/// The contents of the regular file at `path`, if it holds at most `cap` bytes.
pub fn read(path: &Path, cap: u64) -> Result<Vec<u8>, FileError> {
    read_capped(path, cap).map_err(|problem| FileError {
        path: path.to_owned(),
        problem,
    })
}

/// [`read`] as text; contents that are not UTF-8 are an error.
pub fn read_to_string(path: &Path, cap: u64) -> Result<String, FileError> {
    let bytes = read(path, cap)?;
    String::from_utf8(bytes).map_err(|_| FileError {
        path: path.to_owned(),
        problem: Unreadable::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )),
    })
}

/// [`read`] on tokio's blocking pool, so the async workers go on meanwhile.
pub async fn read_off_runtime(path: PathBuf, cap: u64) -> Result<Vec<u8>, FileError> {
    let reading = tokio::task::spawn_blocking({
        let path = path.clone();
        move || read(&path, cap)
    });
    // The read cannot panic; a runtime shutting down cancels it.
    reading.await.unwrap_or_else(|error| {
        Err(FileError {
            path,
            problem: Unreadable::Io(io::Error::other(error)),
        })
    })
}

fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, Unreadable> {
    let file = open_without_waiting(path)?;
    let metadata = file.metadata()?;
    let kind = Kind::of(&metadata.file_type());
    if kind != Kind::File {
        return Err(Unreadable::NotAFile(kind.described()));
    }
    if metadata.len() > cap {
        return Err(Unreadable::TooBig {
            size: metadata.len(),
            cap,
        });
    }
    // The file may grow between the look and the read: never read more than one byte past
    // the cap.
    let mut contents = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
    file.take(cap.saturating_add(1))
        .read_to_end(&mut contents)?;
    match contents.len() as u64 {
        size if size > cap => Err(Unreadable::TooBig { size, cap }),
        _ => Ok(contents),
    }
}

/// Opens `path` to read without waiting for a writer, should it be a FIFO. (On a regular
/// file the flag changes nothing.)
fn open_without_waiting(path: &Path) -> io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(path)
}

/// What a name leads to, as error messages name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Directory,
    Fifo,
    CharacterDevice,
    BlockDevice,
    Socket,
    Other,
}

impl Kind {
    fn of(file_type: &std::fs::FileType) -> Kind {
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            if file_type.is_fifo() {
                return Kind::Fifo;
            }
            if file_type.is_char_device() {
                return Kind::CharacterDevice;
            }
            if file_type.is_block_device() {
                return Kind::BlockDevice;
            }
            if file_type.is_socket() {
                return Kind::Socket;
            }
        }
        if file_type.is_file() {
            Kind::File
        } else if file_type.is_dir() {
            Kind::Directory
        } else {
            Kind::Other
        }
    }

    fn described(self) -> &'static str {
        match self {
            Kind::File => "a regular file",
            Kind::Directory => "a directory",
            Kind::Fifo => "a FIFO",
            Kind::CharacterDevice => "a character device",
            Kind::BlockDevice => "a block device",
            Kind::Socket => "a socket",
            Kind::Other => "not a file",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(path: &Path, cap: u64) -> String {
        read(path, cap).expect_err("refused").to_string()
    }

    #[test]
    fn a_regular_file_up_to_the_cap_is_read_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.pem");
        std::fs::write(&path, "four").expect("write");
        assert_eq!(read(&path, 4).expect("read"), b"four");
        assert_eq!(read_to_string(&path, 4).expect("read"), "four");
    }

    #[test]
    fn a_file_over_the_cap_is_refused_naming_it_and_the_cap() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.pem");
        std::fs::write(&path, "fives").expect("write");
        let message = problem(&path, 4);
        assert!(
            message.starts_with(&path.display().to_string()),
            "{message}"
        );
        assert!(message.contains("over the cap of 4 bytes"), "{message}");
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("pipe");
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        assert!(problem(&path, 4).contains("it is a FIFO, not a regular file"));
    }

    #[test]
    fn an_endless_device_behind_a_link_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cert.pem");
        std::os::unix::fs::symlink("/dev/zero", &path).expect("a link");
        let message = problem(&path, PEM_MAX_BYTES);
        assert!(message.contains("a character device"), "{message}");
    }

    #[test]
    fn a_directory_or_a_missing_file_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(problem(dir.path(), 4).contains("a directory"));
        assert!(problem(&dir.path().join("gone"), 4).contains("No such file"));
    }
}
