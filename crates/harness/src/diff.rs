//! A session's workspace as the log knows it at any position: what changed between
//! two positions, as content diffs, and the files themselves, all read from the
//! drive's snapshots (the live workspace is never touched).

use serde::{Deserialize, Serialize};
use steadfast_drive::{ChangeKind, Entry};
use steadfast_log::SessionState;
use steadfast_sandbox::Sandbox;
use steadfast_world::World;

use crate::harness::Harness;
use crate::{Error, Result};

/// Files bigger than this are listed as changed without their content diff.
const MAX_DIFFED: u64 = 1024 * 1024;

/// The workspace changes between two log positions.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WorkspaceDiff {
    /// The earlier position (0: as the session began).
    pub from_seq: u64,
    /// The later position.
    pub to_seq: u64,
    /// The snapshot in force at `from_seq`.
    #[schema(required = true)]
    pub from_snapshot: Option<String>,
    /// The snapshot in force at `to_seq`.
    #[schema(required = true)]
    pub to_snapshot: Option<String>,
    /// Each changed path, in path order.
    pub files: Vec<FileDiff>,
}

/// One changed path.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileDiff {
    /// The path, relative to the workspace.
    pub path: String,
    /// `added`, `removed` or `modified`.
    pub change: ChangeKind,
    /// A unified diff of its text (`None` for binary, huge or non-regular files).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// Why there is no patch, if there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl WorkspaceDiff {
    /// The whole diff as text, file by file, in the format of `git diff`.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for f in &self.files {
            let change = format!("{:?}", f.change).to_lowercase();
            out.push_str(&format!("diff a/{0} b/{0} ({change})\n", f.path));
            match (&f.patch, &f.note) {
                (Some(patch), _) => out.push_str(patch),
                (None, Some(note)) => out.push_str(&format!("{note}\n")),
                (None, None) => {}
            }
        }
        out
    }

    /// One line per changed path (`modified src/lib.rs`), for reports.
    pub fn summary(&self) -> Vec<String> {
        self.files
            .iter()
            .map(|f| format!("{} {}", format!("{:?}", f.change).to_lowercase(), f.path))
            .collect()
    }
}

impl<W: World + Clone, S: Sandbox> Harness<W, S> {
    /// What `session` changed in its workspace from log position `from` (default: as
    /// it began) to `to` (default: now).
    pub async fn diff(
        &self,
        session: &str,
        from: Option<u64>,
        to: Option<u64>,
    ) -> Result<WorkspaceDiff> {
        let records = self.world().read(session, 1).await?;
        let last = records.len() as u64;
        let (from, to) = (from.unwrap_or(0), to.unwrap_or(last));
        if from > to || to > last {
            return Err(Error::Invalid(format!(
                "from {from} and to {to} must satisfy 0 <= from <= to <= {last} (the last log position)"
            )));
        }
        let (a, b) = (snapshot_at(&records, from)?, snapshot_at(&records, to)?);
        let drive = self.drive.clone();
        let (a2, b2) = (a.clone(), b.clone());
        let files = tokio::task::spawn_blocking(move || match (a2, b2) {
            (Some(a), Some(b)) => file_diffs(&drive, &a, &b),
            _ => Ok(Vec::new()),
        })
        .await??;
        Ok(WorkspaceDiff {
            from_seq: from,
            to_seq: to,
            from_snapshot: a,
            to_snapshot: b,
            files,
        })
    }

    /// The paths a session changed since it began, one line each, for its final
    /// record and reports.
    pub(crate) fn changes_since_start(&self, state: &SessionState) -> Vec<String> {
        steadfast_journal::escalate::changes_since_start(&self.drive, state)
    }
}

/// The snapshot in force at log position `n` of `records` (0: as the session began).
fn snapshot_at(records: &[steadfast_log::Record], n: u64) -> Result<Option<String>> {
    let state = steadfast_log::fold(&records[..(n.max(1) as usize).min(records.len())])?;
    Ok(if n == 0 {
        state.initial_snapshot
    } else {
        state.last_snapshot
    })
}

/// One path of a workspace snapshot.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct WorkspaceEntry {
    /// The path, relative to the workspace.
    pub path: String,
    /// What it is, with its size and hash for files.
    #[serde(flatten)]
    pub entry: Entry,
}

/// A session's workspace at one log position.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct WorkspaceListing {
    /// The position.
    pub at_seq: u64,
    /// The snapshot in force there.
    #[schema(required = true)]
    pub snapshot: Option<String>,
    /// Every path, in order.
    pub entries: Vec<WorkspaceEntry>,
}

impl<W: World + Clone, S: Sandbox> Harness<W, S> {
    /// The snapshot in force at `at` (default: now), checked against the log's length.
    /// The log position `at` (default: the last), the workspace snapshot at it, and
    /// when it was recorded (ms since the epoch; 0 before the first record).
    async fn snapshot_at(
        &self,
        session: &str,
        at: Option<u64>,
    ) -> Result<(u64, Option<String>, u64)> {
        let records = self.world().read(session, 1).await?;
        let last = records.len() as u64;
        let at = at.unwrap_or(last);
        if at > last {
            return Err(Error::Invalid(format!(
                "at {at} is past the last log position ({last})"
            )));
        }
        let at_ms = at
            .checked_sub(1)
            .and_then(|i| records.get(i as usize))
            .map_or(0, |r| r.at_ms);
        Ok((at, snapshot_at(&records, at)?, at_ms))
    }

    /// Every path of `session`'s workspace as it was at log position `at` (default:
    /// now).
    pub async fn files(&self, session: &str, at: Option<u64>) -> Result<WorkspaceListing> {
        let (at, snapshot, _) = self.snapshot_at(session, at).await?;
        let entries = match &snapshot {
            Some(id) => self
                .drive
                .manifest(id)?
                .entries
                .into_iter()
                .map(|(path, entry)| WorkspaceEntry { path, entry })
                .collect(),
            None => Vec::new(),
        };
        Ok(WorkspaceListing {
            at_seq: at,
            snapshot,
            entries,
        })
    }

    /// The bytes of the file at `path` in `session`'s workspace as it was at log
    /// position `at` (default: now). [`Error::NoFile`] if there was no such file.
    pub async fn file(&self, session: &str, path: &str, at: Option<u64>) -> Result<Vec<u8>> {
        let (at, snapshot, _) = self.snapshot_at(session, at).await?;
        let missing = || Error::NoFile(format!("no file {path:?} in the workspace at #{at}"));
        let snapshot = snapshot.ok_or_else(missing)?;
        let drive = self.drive.clone();
        let owned = path.to_string();
        let read = tokio::task::spawn_blocking(move || drive.read_file(&snapshot, &owned)).await?;
        match read {
            Ok(Some(bytes)) => Ok(bytes),
            Ok(None) => Err(missing()),
            Err(e @ (steadfast_drive::Error::NotFound(_) | steadfast_drive::Error::Corrupt(_))) => {
                Err(Error::DataLost(format!(
                    "the file {path:?} at #{at} cannot be read back as recorded: {e}"
                )))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// What `session`'s snapshots lost from the store: every object one of them
    /// reaches that is missing or (reading every file, `read`) corrupt.
    pub async fn lost_objects(
        &self,
        records: &[steadfast_log::Record],
        read: bool,
    ) -> Result<Vec<steadfast_drive::LostObject>> {
        let mut ids: Vec<String> = Vec::new();
        for id in records.iter().flat_map(|r| r.event.snapshots()) {
            if !ids.iter().any(|known| known == id) {
                ids.push(id.to_string());
            }
        }
        let drive = self.drive.clone();
        Ok(tokio::task::spawn_blocking(move || drive.damage(&ids, read)).await?)
    }
}

impl<W: World + Clone, S: Sandbox> Harness<W, S> {
    /// Streams the workspace as it was at log position `at` (default: now) as a tar
    /// archive ([`steadfast_drive::Drive::export_tar`]) into `chunks`, and returns the
    /// position. A position or snapshot that does not exist is an error here, before
    /// any byte; a failure part way (a corrupt object) is the stream's last item, so
    /// the archive ends short rather than wrong. A receiver that goes away stops it.
    pub async fn archive(
        &self,
        session: &str,
        at: Option<u64>,
        chunks: tokio::sync::mpsc::Sender<std::io::Result<Vec<u8>>>,
    ) -> Result<u64> {
        let (at, snapshot, at_ms) = self.snapshot_at(session, at).await?;
        let snapshot =
            snapshot.ok_or_else(|| Error::NoFile(format!("no workspace snapshot at #{at}")))?;
        // Every object there, before the first byte: a lost one is an error, not an
        // archive that ends short.
        let check = (self.drive.clone(), vec![snapshot.clone()]);
        let lost = tokio::task::spawn_blocking(move || check.0.damage(&check.1, false)).await?;
        if let Some(first) = lost.first() {
            return Err(Error::DataLost(format!(
                "the workspace at #{at} cannot be rebuilt: object {} is {} ({} lost in all)",
                first.object,
                first.problem,
                lost.len()
            )));
        }
        let drive = self.drive.clone();
        tokio::task::spawn_blocking(move || {
            let mut out = ChunkWriter {
                chunks: chunks.clone(),
                buf: Vec::with_capacity(ARCHIVE_CHUNK),
            };
            if let Err(e) = drive.export_tar(&snapshot, at_ms / 1000, &mut out) {
                tracing::warn!(error = %e, "workspace archive cut short");
                let _ = chunks.blocking_send(Err(std::io::Error::other(e.to_string())));
            }
        });
        Ok(at)
    }
}

/// How many bytes of an archive go to the client at a time.
const ARCHIVE_CHUNK: usize = 64 * 1024;

/// A blocking writer that hands what is written to an async receiver in chunks.
struct ChunkWriter {
    chunks: tokio::sync::mpsc::Sender<std::io::Result<Vec<u8>>>,
    buf: Vec<u8>,
}

impl std::io::Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= ARCHIVE_CHUNK {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(ARCHIVE_CHUNK));
        self.chunks.blocking_send(Ok(chunk)).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the reader went away")
        })
    }
}

fn file_diffs(drive: &steadfast_drive::Drive, a: &str, b: &str) -> Result<Vec<FileDiff>> {
    let (old, new) = (drive.manifest(a)?, drive.manifest(b)?);
    let mut files = Vec::new();
    for change in old.diff(&new) {
        let before = old.entries.get(&change.path);
        let after = new.entries.get(&change.path);
        let text = |snapshot: &str, entry: Option<&Entry>| -> Result<Option<Option<String>>> {
            // Some(Some(text)), Some(None) for no file here, None for not diffable.
            match entry {
                None => Ok(Some(None)),
                Some(Entry::File { size, .. }) if *size <= MAX_DIFFED => {
                    let bytes = drive.read_file(snapshot, &change.path)?.ok_or_else(|| {
                        steadfast_drive::Error::NotFound(format!("{snapshot}:{}", change.path))
                    })?;
                    Ok(match String::from_utf8(bytes) {
                        Ok(s) if !s.contains('\0') => Some(Some(s)),
                        _ => None,
                    })
                }
                Some(_) => Ok(None),
            }
        };
        let (patch, note) = match (text(a, before)?, text(b, after)?) {
            (Some(old_text), Some(new_text)) => {
                let (old_text, new_text) =
                    (old_text.unwrap_or_default(), new_text.unwrap_or_default());
                let old_name = match before {
                    Some(_) => format!("a/{}", change.path),
                    None => "/dev/null".into(),
                };
                let new_name = match after {
                    Some(_) => format!("b/{}", change.path),
                    None => "/dev/null".into(),
                };
                let diff = similar::TextDiff::from_lines(&old_text, &new_text);
                let patch = diff
                    .unified_diff()
                    .context_radius(3)
                    .header(&old_name, &new_name)
                    .to_string();
                if patch.is_empty() {
                    (None, Some(describe(before, after)))
                } else {
                    (Some(patch), None)
                }
            }
            _ => (None, Some(describe(before, after))),
        };
        files.push(FileDiff {
            path: change.path,
            change: change.kind,
            patch,
            note,
        });
    }
    Ok(files)
}

/// Words for a change that has no text diff.
fn describe(before: Option<&Entry>, after: Option<&Entry>) -> String {
    let what = |e: Option<&Entry>| match e {
        None => "nothing".to_string(),
        Some(Entry::File { size, exec, .. }) => {
            format!(
                "a {}file of {size} bytes",
                if *exec { "executable " } else { "" }
            )
        }
        Some(Entry::Symlink { target }) => format!("a symlink to {target}"),
        Some(Entry::Dir { .. }) => "a directory".into(),
        Some(Entry::Special { special }) => format!("a {special:?}").to_lowercase(),
    };
    format!("was {}, now {} (no text diff)", what(before), what(after))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diff_header_keeps_the_path_as_it_is() {
        let diff = WorkspaceDiff {
            from_seq: 0,
            to_seq: 1,
            from_snapshot: None,
            to_snapshot: None,
            files: vec![FileDiff {
                path: "docs/CHANGELOG.md".into(),
                change: ChangeKind::Modified,
                patch: Some("@@ -1 +1 @@\n-a\n+b\n".into()),
                note: None,
            }],
        };
        assert!(
            diff.to_text()
                .starts_with("diff a/docs/CHANGELOG.md b/docs/CHANGELOG.md (modified)\n"),
            "{}",
            diff.to_text()
        );
        assert_eq!(diff.summary(), ["modified docs/CHANGELOG.md"]);
    }
}
