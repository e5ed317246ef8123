//! Noticing an interrupt while a turn runs. An interrupt is an inbox signal
//! ([`INTERRUPT_SIGNAL`]) that any API process or `steadfast stop` posts to the world;
//! the driver of the session, wherever it runs, watches for it during each model call
//! and command and stops that call at once.

use std::time::Duration;

use steadfast_log::INTERRUPT_SIGNAL;
use steadfast_world::{Inbound, InboundKind, World};

/// How often another process's interrupt is looked for (this process's posts wake the
/// watch at once).
const POLL: Duration = Duration::from_millis(200);

/// An interrupt waiting in `session`'s inbox, if there is one.
pub(crate) async fn pending<W: World>(world: &W, session: &str) -> Option<Inbound> {
    // A read that fails is not an interrupt; the next look (or step) tries again.
    world
        .inbox(session)
        .await
        .ok()?
        .into_iter()
        .find(is_interrupt)
}

/// Whether an inbox entry is an interrupt.
pub(crate) fn is_interrupt(item: &Inbound) -> bool {
    item.kind == InboundKind::Signal && item.name == INTERRUPT_SIGNAL
}

/// Completes when an interrupt for `session` arrives.
pub(crate) async fn arrives<W: World>(world: W, session: String) -> Inbound {
    let mut changes = world.changes();
    loop {
        if let Some(item) = pending(&world, &session).await {
            return item;
        }
        tokio::select! {
            _ = changes.changed() => {}
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

/// Who sent an interrupt, from its payload.
pub(crate) fn sender(item: &Inbound) -> String {
    item.body
        .get("by")
        .and_then(|b| b.as_str())
        .filter(|b| !b.is_empty())
        .unwrap_or("someone")
        .to_string()
}
