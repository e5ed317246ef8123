//! Reading a streamed HTTP reply as server-sent events.

use eventsource_stream::{Event, Eventsource};
use futures_util::{Stream, StreamExt};

use crate::retry::{transport, Attempt};

/// The SSE events of a response body. A transport error mid-stream is retryable.
pub(crate) fn events(
    response: reqwest::Response,
) -> impl Stream<Item = Result<Event, Attempt>> + Unpin {
    response.bytes_stream().eventsource().map(|item| {
        item.map_err(|e| match e {
            eventsource_stream::EventStreamError::Transport(t) => transport(t, true),
            other => Attempt::Retry {
                message: other.to_string(),
                after: None,
                streamed: true,
            },
        })
    })
}
