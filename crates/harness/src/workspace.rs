//! Where a session's workspace is on this host.
//!
//! The log names a workspace without naming a host: a logical id (`ws_...`) that each
//! host materializes under its own workspace root from the drive, which every host
//! shares. A directory a user gave by path is the exception: it stays where the user
//! put it, on the host the log records, and only that host drives the session.

use std::path::{Path, PathBuf};

use steadfast_log::{Event, SessionState};
use steadfast_world::{Lease, World};

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
                 that host drives the session, unless its user moves it here (`steadfast \
                 resume SESSION --move-here DIR`)",
                state.workspace, self.options.host
            ))),
            _ => Ok(PathBuf::from(&state.workspace)),
        }
    }

    /// Between turns, a directory a user named is the user's too: if it is no longer
    /// what the session's last snapshot says (a person edited a file, ran a build,
    /// committed), the change is recorded ([`Event::WorkspaceEdited`], under `lease`)
    /// and the session goes on from the files as they are; the model is told with the
    /// next message. Returns the state with it. Inside a turn a difference is what a
    /// crash left, resolved by rule 4; a logical workspace is Steadfast's own copy.
    pub(crate) async fn adopt_outside_edits(
        &self,
        lease: &steadfast_world::Lease,
        state: SessionState,
    ) -> Result<SessionState> {
        let mut state = self.close_orphaned_shell(lease, state).await?;
        let between_turns = state.phase.status() == steadfast_log::Status::Idle
            && !state.is_ended()
            && !state.rewound_workspace;
        let Some(last) = state.last_snapshot.clone() else {
            return Ok(state);
        };
        if !between_turns || steadfast_log::is_workspace_id(&state.workspace) {
            return Ok(state);
        }
        let dir = self.workspace_dir(&state)?;
        if !dir.is_dir() {
            return Ok(state);
        }
        let found = self.snapshot(&dir).await?;
        if found == last {
            return Ok(state);
        }
        let changes = self.drive.change_lines(&last, &found);
        tracing::info!(session = %lease.session, paths = changes.len(), "the workspace was changed from outside between turns");
        let event = Event::WorkspaceEdited {
            snapshot: found,
            changes,
        };
        for record in self.world.append(lease, &[event]).await? {
            state.apply(&record)?;
        }
        Ok(state)
    }

    /// A person's shell the log shows opened and never left: its holder died with it
    /// (a killed server). On the host it ran on, the workspace is as the person left
    /// it, and what they changed since the shell's last record is recorded
    /// ([`Event::HumanShell`], left) before anything restores the workspace: nothing a
    /// person did is lost with the process. Another host cannot see that copy: there
    /// the shell is recorded as left with no change. Returns the state with it.
    pub(crate) async fn close_orphaned_shell(
        &self,
        lease: &steadfast_world::Lease,
        mut state: SessionState,
    ) -> Result<SessionState> {
        let (Some(open), Some(last)) = (state.open_shell.clone(), state.last_snapshot.clone())
        else {
            return Ok(state);
        };
        let dir = self
            .workspace_dir(&state)
            .ok()
            .filter(|dir| open.host == self.options.host && dir.is_dir());
        let (snapshot, changes) = match dir {
            Some(dir) => {
                let found = self.snapshot(&dir).await?;
                let changes = match found == last {
                    true => Vec::new(),
                    false => self.drive.change_lines(&last, &found),
                };
                (found, changes)
            }
            None => (last, Vec::new()),
        };
        tracing::info!(session = %lease.session, by = %open.by, host = %open.host, paths = changes.len(), "a person's shell ended with its holder; recorded");
        let event = Event::HumanShell {
            by: open.by,
            since_ms: open.since_ms,
            detached: true,
            snapshot,
            changes,
            host: open.host,
        };
        for record in self.world.append(lease, &[event]).await? {
            state.apply(&record)?;
        }
        Ok(state)
    }

    /// Makes the workspace of the session whose `lease` this process has just taken
    /// the lease's alone on this host: whatever a holder that lost it alive still runs
    /// there is killed before anything reads or restores it, except a sandbox made to
    /// outlive its holder, which is adopted with the commands it runs (see
    /// [`steadfast_sandbox::take_over`]). Returns whether one was.
    pub(crate) async fn take_over_workspace(&self, lease: &Lease, state: &SessionState) -> bool {
        let Ok(dir) = self.workspace_dir(state) else {
            return false;
        };
        let (session, epoch) = (lease.session.clone(), lease.epoch);
        // Adopted only for what it may still hold: a call the log shows begun and not
        // finished, or services. Otherwise it is killed, as a stale holder's.
        let cut_off = !state.pending_tools.is_empty()
            || state.wrapped_tools.iter().any(|t| t.result.is_none());
        let adopt = cut_off || !state.services.is_empty();
        // Time enough to provision it, which renews its hold from then on.
        let grace = if adopt {
            self.options.lease_ttl / 2
        } else {
            std::time::Duration::ZERO
        };
        let taken = tokio::task::spawn_blocking(move || {
            steadfast_sandbox::take_over(&dir, &session, epoch, grace)
        })
        .await
        .unwrap_or_default();
        if taken.killed > 0 {
            tracing::warn!(
                killed = taken.killed,
                "took the workspace over from a holder that lost the lease"
            );
        }
        taken.adopted > 0
    }

    /// The workspace a wake leaves ready for `state`. The native loop's is always the
    /// log's: brought to the last snapshot on every wake, whoever drove it last. A
    /// wrapped CLI's directory is left as its user had it, unless a rewind put it back
    /// and no turn has begun since (a logical workspace is the log's for every agent).
    /// Either is left as it is when the last holder's sandbox was `adopted`, still
    /// working in it: what its kept commands do is recorded when they end, and any
    /// other cut-off call is resolved by rule 4, which puts back what it must.
    pub(crate) async fn workspace_at_wake(
        &self,
        state: &SessionState,
        adopted: bool,
    ) -> Result<PathBuf> {
        match adopted {
            false => {
                let restore_directory = !state.is_wrapped() || state.rewound_workspace;
                self.materialize(state, restore_directory).await
            }
            true => self.materialize_as_left(state),
        }
    }

    /// The workspace as the last holder on this host left it, not restored: its
    /// adopted sandbox still works in it.
    pub(crate) fn materialize_as_left(&self, state: &SessionState) -> Result<PathBuf> {
        let dir = self.workspace_dir(state)?;
        Ok(dir.canonicalize().unwrap_or(dir))
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
            self.drive.restore_async(&dir, snapshot).await?;
        }
        // As the sandbox and the CLIs in it see it (the gateway recognizes it in their
        // requests by this name).
        Ok(dir.canonicalize().unwrap_or(dir))
    }
}

impl<W: World + Clone, S: steadfast_sandbox::Sandbox> Harness<W, S> {
    /// Moves `session`, which works in a directory on one host, to `dir` on this one,
    /// at its user's word (`steadfast resume --move-here DIR`): a session bound to a
    /// directory is otherwise driven only there. `dir` must be empty or absent; it is
    /// brought to the session's last snapshot, and then the move is recorded
    /// ([`Event::WorkspaceMoved`]), so a crash in between leaves the session where it
    /// was. The old directory is left as it is. Refused for a session being driven
    /// (its lease is held), for one that is over, and for a logical workspace, which
    /// every host has. Returns the new directory.
    pub async fn move_workspace_here(&self, session: &str, dir: &Path) -> Result<PathBuf> {
        let lease = match self
            .world
            .acquire_lease(session, &self.holder, self.options.lease_ttl)
            .await
        {
            Err(steadfast_world::Error::LeaseHeld { holder, .. }) => {
                return Err(Error::Invalid(format!(
                    "session {session} is being driven (by {holder}): stop it there first, \
                     or wait for its lease to lapse if that host is gone"
                )))
            }
            other => other?,
        };
        let moved = self.move_leased(&lease, dir).await;
        let _ = self.world.release_lease(&lease).await;
        moved
    }

    async fn move_leased(&self, lease: &steadfast_world::Lease, dir: &Path) -> Result<PathBuf> {
        let state = self.state(&lease.session).await?;
        if state.is_ended() {
            return Err(Error::Invalid(format!(
                "session {} is over: there is nothing to move",
                lease.session
            )));
        }
        if steadfast_log::is_workspace_id(&state.workspace) {
            return Err(Error::Invalid(format!(
                "session {} works in the logical workspace {}, which every host \
                 materializes in its own workspace root: there is nothing to move",
                lease.session, state.workspace
            )));
        }
        let invalid = |what: &str| Error::Invalid(format!("{}: {what}", dir.display()));
        let dir = std::path::absolute(dir).map_err(|e| invalid(&e.to_string()))?;
        // What a failed move removes again: the outermost directory it created.
        let created = dir
            .ancestors()
            .take_while(|d| !d.exists())
            .last()
            .map(Path::to_path_buf);
        std::fs::create_dir_all(&dir).map_err(|e| invalid(&e.to_string()))?;
        let dir = dir.canonicalize().map_err(|e| invalid(&e.to_string()))?;
        let here = state
            .workspace_host
            .as_deref()
            .unwrap_or(&self.options.host);
        if dir == Path::new(&state.workspace) && here == self.options.host {
            return Ok(dir); // already there
        }
        let empty = std::fs::read_dir(&dir)
            .map_err(|e| invalid(&e.to_string()))?
            .next()
            .is_none();
        if !empty {
            return Err(invalid(
                "not empty: a session is moved into an empty directory, where its last \
                 snapshot is restored",
            ));
        }
        let restored = async {
            self.keep_home_out(&dir)?;
            if let Some(snapshot) = &state.last_snapshot {
                self.drive.restore_async(&dir, snapshot).await?;
            }
            Ok::<_, Error>(())
        };
        if let Err(e) = restored.await {
            let _ = match &created {
                Some(top) => std::fs::remove_dir_all(top),
                None => empty_dir(&dir),
            };
            return Err(e);
        }
        // A failed append may still have committed: the directory, at the snapshot
        // either way, is left for the log to name.
        let event = Event::WorkspaceMoved {
            workspace: dir.to_string_lossy().into_owned(),
            host: self.options.host.clone(),
            from_workspace: state.workspace.clone(),
            from_host: state.workspace_host.clone(),
            snapshot: state.last_snapshot.clone(),
        };
        self.world.append(lease, &[event]).await?;
        Ok(dir)
    }
}

/// Removes everything in `dir`, keeping it.
fn empty_dir(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        match path.is_dir() && !path.is_symlink() {
            true => std::fs::remove_dir_all(&path)?,
            false => std::fs::remove_file(&path)?,
        }
    }
    Ok(())
}
