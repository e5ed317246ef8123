//! People in a session's sandbox: a shell a person attaches (see
//! `steadfast_sandbox::shell`), and the record of what they changed.
//!
//! A writable shell is given only by a journal that serves no turn (a visitors'
//! hold): what a person changes is then never mixed with a tool call's changes. It is
//! recorded as [`Event::HumanShell`] when they leave, and every few minutes while they
//! stay if something changed, from a snapshot taken as a tool call's would be (one
//! writer of the record and the workspace at a time). The holder keeps the session's
//! lease while anyone is in, and asks them to leave when someone needs it (a close,
//! a delete, a rewind): their shells are recorded, then closed.

use steadfast_log::Event;
use steadfast_sandbox::Sandbox;
use steadfast_world::World;

use crate::calls::Journal;
use crate::reach::{PersonIn, ShellMoment};
use crate::Result;

impl<W: World + Clone, S: Sandbox> Journal<W, S> {
    /// Counts a person in a writable shell until the guard drops: the holder keeps the
    /// lease for them (see the module's doc).
    pub fn person_in(&self) -> PersonIn {
        self.people.send_modify(|n| *n += 1);
        PersonIn::new(self.people.clone())
    }

    /// How many people are in writable shells now.
    pub fn people(&self) -> usize {
        *self.people.borrow()
    }

    /// Watches how many people are in writable shells.
    pub fn people_watch(&self) -> tokio::sync::watch::Receiver<usize> {
        self.people.subscribe()
    }

    /// Asks everyone in a shell to leave (their shells are recorded, then closed).
    pub fn ask_people_to_leave(&self) {
        self.leave.send_replace(true);
    }

    /// Completes once people are asked to leave.
    pub async fn asked_to_leave(&self) {
        let mut asked = self.leave.subscribe();
        let _ = asked.wait_for(|asked| *asked).await;
    }

    /// Records what a person (`by`, in since `since_ms`) changed in the workspace since
    /// the log's last snapshot, as a [`Event::HumanShell`] record, at `moment` (see
    /// [`ShellMoment`]). Returns the changes.
    pub async fn record_person(
        &self,
        by: &str,
        since_ms: u64,
        moment: ShellMoment,
    ) -> Result<Vec<String>> {
        let _recording = self.recording.lock().await;
        let _writer = self.one_writer.lock().await;
        let before = self.live.with(|s| s.last_snapshot.clone());
        let found = self.snapshot().await?;
        let changes = match &before {
            Some(before) if *before != found => self.drive.change_lines(before, &found),
            _ => Vec::new(),
        };
        if moment == ShellMoment::Staying && changes.is_empty() {
            return Ok(changes);
        }
        self.live
            .append(&[Event::HumanShell {
                by: by.to_string(),
                since_ms,
                detached: moment == ShellMoment::Left,
                snapshot: found.clone(),
                changes: changes.clone(),
                host: steadfast_world::host_id(),
            }])
            .await?;
        *self.last_snapshot.lock().unwrap_or_else(|e| e.into_inner()) = Some(found);
        Ok(changes)
    }
}
