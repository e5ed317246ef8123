//! Whether a session has work for a worker, decided for one session in hand: the rule
//! the stores' claim query applies to every session at once (`HAS_WORK` in each
//! backend), which the conformance suite holds them to
//! ([`crate::conformance::work_is_what_a_worker_claims`]).

use steadfast_log::{Phase, SessionState};

use crate::interrupt::is_interrupt;
use crate::{Inbound, InboundKind};

/// Whether a session in `state`, with `inbox` not yet taken, has work a worker claims:
/// a turn open; a message or steer for an idle session; for a waiting one, the signal
/// it awaits or an interrupt; for an escalated one, `resume`. A signal queued for a
/// wait not begun, or an interrupt that came after its turn, is not work (a retry's
/// back-off aside, which the store also weighs).
pub fn has_work(state: &SessionState, inbox: &[Inbound]) -> bool {
    let signal = |name: &str| {
        inbox
            .iter()
            .any(|i| i.kind == InboundKind::Signal && i.name == name)
    };
    match &state.phase {
        Phase::Running { .. } => true,
        Phase::Idle { .. } => inbox
            .iter()
            .any(|i| matches!(i.kind, InboundKind::Message | InboundKind::Steer)),
        Phase::Waiting(wait) => inbox.iter().any(is_interrupt) || signal(&wait.name),
        Phase::Escalated { .. } => signal(steadfast_log::RESUME_SIGNAL),
        Phase::Ended { .. } => false,
    }
}
