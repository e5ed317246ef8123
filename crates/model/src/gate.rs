//! Sending a request while its intent commits, holding back its last byte.
//!
//! A model call is paid for once the provider has the whole request, so the harness
//! records the call's intent before that (a crash between the call and its record
//! would pay for it again on wake). Nothing stops the request from being *sent*
//! meanwhile: its headers and all of its body but the last byte go out while the
//! intent commits, and the last byte follows once it has. A provider cannot act on a
//! body it has not finished receiving (the length is declared); if the process dies
//! first, or the intent is refused, the connection closes short of that length and
//! the request is discarded. So the commit hides behind the upload instead of adding
//! to it: on a long conversation's request, or a provider far away, most of it.

use bytes::Bytes;
use futures_util::StreamExt;

/// Opens a [`Gate`]: the intent is durable, the request may complete. Dropped without
/// opening, it refuses the gate, and the held request is abandoned.
#[derive(Debug)]
pub struct GateOpener(tokio::sync::watch::Sender<bool>);

impl GateOpener {
    /// Lets the held request complete.
    pub fn open(self) {
        self.0.send_replace(true);
    }
}

/// Whether a request may complete (see the module's documentation).
#[derive(Debug, Clone)]
pub struct Gate(tokio::sync::watch::Receiver<bool>);

/// A gate held shut until its opener opens it.
pub fn gate() -> (GateOpener, Gate) {
    let (open, gate) = tokio::sync::watch::channel(false);
    (GateOpener(open), Gate(gate))
}

impl Gate {
    /// A gate that is open already (a request with nothing to wait for).
    pub fn open() -> Gate {
        let (opener, gate) = gate();
        opener.open();
        gate
    }

    /// Whether the gate was refused: its opener went away without opening it.
    pub(crate) fn refused(&self) -> bool {
        !*self.0.borrow() && self.0.has_changed().is_err()
    }

    /// Puts `body` on `request` under this gate, its length declared (the provider
    /// waits for all of it, which is what lets the gate hold the call back).
    pub fn attach(
        &self,
        request: reqwest::RequestBuilder,
        body: &Bytes,
    ) -> reqwest::RequestBuilder {
        request
            .header(reqwest::header::CONTENT_LENGTH, body.len())
            .body(self.body(body))
    }

    /// The request body to send under this gate: the bytes themselves once it is open;
    /// before that, all but the last byte at once and the last when it opens (an
    /// error instead if it is refused, which aborts the request).
    fn body(&self, body: &Bytes) -> reqwest::Body {
        if *self.0.borrow() || body.is_empty() {
            return body.clone().into();
        }
        let split = body.len() - 1;
        let (head, last) = (body.slice(..split), body.slice(split..));
        let mut gate = self.0.clone();
        let last = async move {
            match gate.wait_for(|open| *open).await {
                Ok(_) => Ok(last),
                Err(_) => Err(std::io::Error::other(
                    "the call's intent was not recorded: request withheld",
                )),
            }
        };
        let chunks = futures_util::stream::once(async move { Ok::<_, std::io::Error>(head) })
            .chain(futures_util::stream::once(last));
        reqwest::Body::wrap_stream(chunks)
    }
}

/// Runs `first` (an intent's append) to its end while polling `other` (the request
/// it holds back, or a read going on meanwhile) in the same task: returns `first`'s
/// output, and `other`'s if it ended first. In the same task, not a spawned one, so
/// the reply's head reaches whoever awaits `other` next with no task between.
pub async fn while_polling<A, F>(
    first: A,
    mut other: std::pin::Pin<&mut F>,
) -> (A::Output, Option<F::Output>)
where
    A: std::future::Future,
    F: std::future::Future + ?Sized,
{
    let mut first = std::pin::pin!(first);
    let mut ended = None;
    let output = std::future::poll_fn(|cx| {
        // The append first: its commit is what everything waits for.
        if let std::task::Poll::Ready(output) = first.as_mut().poll(cx) {
            return std::task::Poll::Ready(output);
        }
        if ended.is_none() {
            if let std::task::Poll::Ready(out) = other.as_mut().poll(cx) {
                ended = Some(out);
            }
        }
        std::task::Poll::Pending
    })
    .await;
    (output, ended)
}
