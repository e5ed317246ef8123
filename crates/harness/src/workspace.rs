//! Where a session's workspace is on this host.
//!
//! The log names a workspace without naming a host: a logical id (`ws_...`) that each
//! host materializes under its own workspace root from the drive, which every host
//! shares. A directory a user gave by path is the exception: it stays where the user
//! put it, on the host the log records, and only that host drives the session.

use std::path::{Path, PathBuf};

use steadfast_drive::Drive;
use steadfast_log::SessionState;
use steadfast_world::World;

use crate::harness::Harness;
use crate::{Error, Result};

/// A new logical workspace id.
pub fn new_workspace_id() -> String {
    format!("ws_{}", uuid::Uuid::now_v7().simple())
}

/// Where a host materializes logical workspaces: `configured`, or `workspaces/`
/// under its home.
pub fn workspace_root(home: &Path, configured: Option<&Path>) -> PathBuf {
    configured.map_or_else(|| home.join("workspaces"), Path::to_path_buf)
}

impl<W: World + Clone, S: steadfast_sandbox::Sandbox> Harness<W, S> {
    /// Where this host materializes logical workspaces: the configured root, or
    /// `workspaces/` under the home.
    pub fn workspace_root(&self) -> Result<PathBuf> {
        match (&self.options.workspace_root, &self.home) {
            (Some(root), _) => Ok(root.clone()),
            (None, Some(home)) => Ok(workspace_root(home, None)),
            (None, None) => Err(Error::Invalid(
                "this harness has no workspace root for logical workspaces".into(),
            )),
        }
    }

    /// The directory of logical workspace `id` on this host (not created).
    pub fn workspace_dir_of(&self, id: &str) -> Result<PathBuf> {
        if !steadfast_log::is_workspace_id(id) {
            return Err(Error::Invalid(format!("`{id}` is not a workspace id")));
        }
        Ok(self.workspace_root()?.join(id))
    }

    /// Where `state`'s workspace is on this host; [`Error::NotHere`] for a directory
    /// that lives on another host.
    pub fn workspace_dir(&self, state: &SessionState) -> Result<PathBuf> {
        if steadfast_log::is_workspace_id(&state.workspace) {
            return self.workspace_dir_of(&state.workspace);
        }
        match &state.workspace_host {
            Some(host) if *host != self.options.host => Err(Error::NotHere(format!(
                "the workspace {} is a directory on host `{host}`, and this is `{}`: only \
                 that host drives the session",
                state.workspace, self.options.host
            ))),
            _ => Ok(PathBuf::from(&state.workspace)),
        }
    }

    /// Makes `state`'s workspace ready on this host and returns it: a logical one is
    /// created if missing and brought to the last recorded snapshot (touching only
    /// what differs from what is already there); a directory is brought to it too
    /// when `restore_directory` says so.
    pub(crate) async fn materialize(
        &self,
        state: &SessionState,
        restore_directory: bool,
    ) -> Result<PathBuf> {
        let dir = self.workspace_dir(state)?;
        let logical = steadfast_log::is_workspace_id(&state.workspace);
        if logical {
            std::fs::create_dir_all(&dir)
                .map_err(|e| Error::Invalid(format!("workspace {}: {e}", dir.display())))?;
        }
        if let (Some(snapshot), true) = (&state.last_snapshot, logical || restore_directory) {
            restore(&self.drive, &dir, snapshot).await?;
        }
        // As the sandbox and the CLIs in it see it (the gateway recognizes it in their
        // requests by this name).
        Ok(dir.canonicalize().unwrap_or(dir))
    }
}

/// Brings `dir` to `snapshot`, off the async threads.
pub(crate) async fn restore(drive: &Drive, dir: &Path, snapshot: &str) -> Result<()> {
    let (drive, dir, snapshot) = (drive.clone(), dir.to_path_buf(), snapshot.to_string());
    tokio::task::spawn_blocking(move || drive.restore(&dir, &snapshot))
        .await
        .map_err(|e| Error::Invalid(format!("restore task failed: {e}")))??;
    Ok(())
}
