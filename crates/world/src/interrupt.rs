//! Noticing an interrupt while a turn runs. An interrupt is an inbox signal
//! ([`INTERRUPT_SIGNAL`]) that any API process or `steadfast stop` posts to the world;
//! the driver of the session, wherever it runs (the native loop, or a wrapped CLI's
//! turn), watches for it during each model call and command and stops at once.

use std::time::Duration;

use crate::{Inbound, InboundKind, World};
use steadfast_log::INTERRUPT_SIGNAL;

/// How often another process's interrupt is looked for (this process's posts wake the
/// watch at once).
const POLL: Duration = Duration::from_millis(200);

/// An interrupt waiting in `session`'s inbox, if there is one.
pub async fn pending<W: World>(world: &W, session: &str) -> Option<Inbound> {
    // A read that fails is not an interrupt; the next look (or step) tries again.
    world
        .inbox(session)
        .await
        .ok()?
        .into_iter()
        .find(is_interrupt)
}

/// Whether an inbox entry is an interrupt.
pub fn is_interrupt(item: &Inbound) -> bool {
    item.kind == InboundKind::Signal && item.name == INTERRUPT_SIGNAL
}

/// Completes when an interrupt for `session` arrives.
pub async fn arrives<W: World>(world: W, session: String) -> Inbound {
    watch(world, session, false).await
}

/// [`arrives`] for the holder of `lease`, who has just appended: when that append
/// found the inbox empty ([`World::inbox_seen_empty`]), the first look waits for a
/// change or the poll instead of reading at once (an interrupt posted since is seen
/// within the poll, as one posted during the call is).
pub fn arrives_after_append<W: World>(
    world: W,
    lease: &crate::Lease,
) -> impl std::future::Future<Output = Inbound> + Send {
    let seen_empty = world.inbox_seen_empty(lease);
    watch(world, lease.session.clone(), seen_empty)
}

async fn watch<W: World>(world: W, session: String, mut seen_empty: bool) -> Inbound {
    let mut changes = world.changes();
    loop {
        if !std::mem::take(&mut seen_empty) {
            if let Some(item) = pending(&world, &session).await {
                return item;
            }
        }
        tokio::select! {
            _ = changes.changed() => {}
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

/// Who sent an interrupt, from its payload.
pub fn sender(item: &Inbound) -> String {
    item.body
        .get("by")
        .and_then(|b| b.as_str())
        .filter(|b| !b.is_empty())
        .unwrap_or("someone")
        .to_string()
}
