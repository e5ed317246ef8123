//! The workspace between turns: edits from outside the session, a person's shell in
//! its sandbox, a move to another directory, and the note each leaves for the model.

use super::{Folded, OpenShell, Phase, SessionState};
use crate::event::Event;
use crate::is_workspace_id;

/// The most changed paths an edit's note to the model names one by one.
const EDITED_NOTE_PATHS: usize = 50;

impl SessionState {
    /// The workspace changed from outside the session while it was idle.
    pub(super) fn workspace_edited(&mut self, event: &Event) -> Folded {
        let Event::WorkspaceEdited { snapshot, changes } = event else {
            return Err("not an edit");
        };
        if is_workspace_id(&self.workspace) || !self.is_idle() {
            return Err("an edit from outside is taken between turns, in a directory");
        }
        self.last_snapshot = Some(snapshot.clone());
        // Files only touched (their times changed, not their content or modes) are
        // nothing to tell the model.
        if !changes.is_empty() {
            self.note_for_next_turn(&edited_note(changes));
        }
        Ok(())
    }

    /// A person's shell in the sandbox, opened or left between turns.
    pub(super) fn human_shell(&mut self, event: &Event) -> Folded {
        let Event::HumanShell {
            by,
            since_ms,
            detached,
            snapshot,
            changes,
            host,
        } = event
        else {
            return Err("not a shell");
        };
        if matches!(self.phase, Phase::Ended { .. } | Phase::Running { .. }) {
            return Err("a person's shell is recorded between turns of a session that goes on");
        }
        self.last_snapshot = Some(snapshot.clone());
        if !changes.is_empty() {
            self.note_for_next_turn(&shell_note(by, changes));
        }
        self.open_shell = (!detached).then(|| OpenShell {
            by: by.clone(),
            since_ms: *since_ms,
            host: host.clone(),
        });
        Ok(())
    }

    /// The session's directory moved (to another host, say), at its last snapshot.
    pub(super) fn workspace_moved(&mut self, event: &Event) -> Folded {
        let Event::WorkspaceMoved {
            workspace,
            host,
            from_workspace,
            snapshot,
            ..
        } = event
        else {
            return Err("not a move");
        };
        if is_workspace_id(&self.workspace) || is_workspace_id(workspace) {
            return Err("a logical workspace is on every host, never moved");
        }
        if *from_workspace != self.workspace {
            return Err("moved from a directory the session is not in");
        }
        if *snapshot != self.last_snapshot {
            return Err("the new directory is not at the last snapshot");
        }
        // The native prompt names the directory: it names the new one now.
        self.system = self.system.replace(from_workspace.as_str(), workspace);
        self.former_workspaces
            .push(std::mem::replace(&mut self.workspace, workspace.clone()));
        self.workspace_host = Some(host.clone());
        Ok(())
    }

    /// Adds `note` to what the model is told with the next user message.
    pub(super) fn note_for_next_turn(&mut self, note: &str) {
        self.rewind_note = Some(match self.rewind_note.take() {
            Some(earlier) => format!("{earlier}\n\n{note}"),
            None => note.to_string(),
        });
    }
}

/// What the model is told of what a person changed in a shell in its sandbox.
fn shell_note(by: &str, changes: &[String]) -> String {
    changes_note(
        &format!(
            "[steadfast] Between turns, {by} opened a shell in this session's sandbox and \
             changed its workspace; the files are as they were left:"
        ),
        changes,
    )
}

/// What the model is told of a workspace changed from outside the session.
fn edited_note(changes: &[String]) -> String {
    changes_note(
        "[steadfast] While the session was paused, its workspace was changed from outside \
         it (by a person or another program); the files are as they were left:",
        changes,
    )
}

/// `opening`, then the changed paths a line each, the first [`EDITED_NOTE_PATHS`] of
/// them named.
fn changes_note(opening: &str, changes: &[String]) -> String {
    let mut note = opening.to_string();
    for change in changes.iter().take(EDITED_NOTE_PATHS) {
        note.push_str(&format!("\n- {change}"));
    }
    if changes.len() > EDITED_NOTE_PATHS {
        note.push_str(&format!(
            "\n- and {} more",
            changes.len() - EDITED_NOTE_PATHS
        ));
    }
    note
}
