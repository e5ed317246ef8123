//! Opening workspace files so that nothing a command leaves in the workspace can block
//! a tool: a FIFO, a socket or a device is named and refused, never opened for reading
//! or writing in a way that waits, and a file is read only up to a bound, however big
//! (or sparse) it claims to be.
//!
//! Every open is non-blocking (`O_NONBLOCK`: opening a FIFO never waits for its other
//! end) and does not follow a link in the last component (`O_NOFOLLOW`: the path was
//! confined to the workspace with its links resolved, and a link swapped in since is
//! refused), and what was opened is checked with `fstat` before a byte moves.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use nix::libc;

/// The most bytes a tool reads of one file.
pub(crate) const MAX_READ: u64 = 16 * 1024 * 1024;

/// What kind of special file `meta` is, in words, if it is one.
fn special(meta: &std::fs::Metadata) -> Option<&'static str> {
    let kind = meta.file_type();
    if kind.is_file() {
        None
    } else if kind.is_fifo() {
        Some("a FIFO")
    } else if kind.is_socket() {
        Some("a socket")
    } else if kind.is_char_device() || kind.is_block_device() {
        Some("a device")
    } else if kind.is_dir() {
        Some("a directory")
    } else if kind.is_symlink() {
        Some("a symbolic link")
    } else {
        Some("not a regular file")
    }
}

fn refuse(raw: &str, what: &str) -> String {
    format!(
        "{raw} is {what}, not a regular file: the file tools do not open it (use bash if you must)"
    )
}

/// Opens `path` (shown as `raw`) for reading, checked to be a regular file.
fn open_regular(path: &Path, raw: &str) -> Result<(File, u64), String> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if let Some(what) = special(&meta) {
            return Err(refuse(raw, what));
        }
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            // Swapped for a link or a socket since the look above.
            Some(libc::ELOOP) => refuse(raw, "a symbolic link"),
            Some(libc::ENXIO) => refuse(raw, "a socket"),
            _ => format!("cannot read {raw}: {e}"),
        })?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read {raw}: {e}"))?;
    if let Some(what) = special(&meta) {
        return Err(refuse(raw, what));
    }
    Ok((file, meta.len()))
}

/// At most `limit` bytes from the start of the regular file `path`, and the file's
/// length.
pub(crate) fn read_bounded(path: &Path, raw: &str, limit: u64) -> Result<(Vec<u8>, u64), String> {
    let (file, len) = open_regular(path, raw)?;
    let mut bytes = Vec::with_capacity(len.min(limit) as usize);
    file.take(limit)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {raw}: {e}"))?;
    Ok((bytes, len))
}

/// Writes `content` to `path` (made, with its directories, if it is not there),
/// which must be a regular file if it is.
pub(crate) fn write_regular(path: &Path, raw: &str, content: &[u8]) -> Result<(), String> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if let Some(what) = special(&meta) {
            return Err(refuse(raw, what));
        }
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refuse(raw, "a symbolic link"),
            // A FIFO swapped in since the check, with no reader.
            Some(libc::ENXIO) => refuse(raw, "a FIFO"),
            _ => format!("cannot write {raw}: {e}"),
        })?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot write {raw}: {e}"))?;
    if let Some(what) = special(&meta) {
        return Err(refuse(raw, what));
    }
    file.write_all(content)
        .map_err(|e| format!("cannot write {raw}: {e}"))
}
