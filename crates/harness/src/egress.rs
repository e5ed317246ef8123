//! The native loop's side of observed effects (see `steadfast_sandbox::egress`): the
//! egress proxy's questions reach the driver while it waits on a tool call, and the
//! driver records each connection in the log with its own appends, in order with
//! everything else it writes.

use std::sync::Arc;

use steadfast_log::Event;
use steadfast_sandbox::egress::{EgressDesk, RecordEgress};
use steadfast_sandbox::proxy::EgressWatch;
use tokio::sync::{mpsc, oneshot};

/// An [`Event::Egress`] for the driver to append, and where to say whether it did.
pub(crate) type EgressRecord = (Event, oneshot::Sender<bool>);

/// The desk a native session's sandbox asks, and the records it wants appended.
pub(crate) struct NativeEgress {
    /// Which call runs in the sandbox now.
    pub desk: Arc<EgressDesk>,
    /// What the desk wants appended (taken by the driver while a call runs).
    pub records: Option<mpsc::Receiver<EgressRecord>>,
}

impl NativeEgress {
    /// A desk, and the watch for the session's sandbox options.
    pub fn new() -> (Self, EgressWatch) {
        let desk = EgressDesk::new();
        let (to_driver, records) = mpsc::channel::<EgressRecord>(8);
        let record: RecordEgress = Arc::new(move |event| {
            let to_driver = to_driver.clone();
            Box::pin(async move {
                let (ack, done) = oneshot::channel();
                if to_driver.send((event, ack)).await.is_err() {
                    return false;
                }
                done.await.unwrap_or(false)
            })
        });
        let watch = desk.watch(record);
        (
            NativeEgress {
                desk,
                records: Some(records),
            },
            watch,
        )
    }
}
