//! The text a streamed reply carries, as it streams: each API's text-delta events
//! picked out of the provider's server-sent events, and journaled in pieces
//! ([`Event::ModelDelta`] under the exchange's id) so the session's event stream shows
//! a wrapped agent's reply as it is written, exactly as it shows a native one's.

use std::time::{Duration, Instant};

use serde_json::Value;
use std::sync::Arc;

use steadfast_log::Event;
use steadfast_world::{LiveSession, World};

use crate::Api;

/// Journal streamed text in pieces of at least this many bytes...
const BATCH: usize = 256;
/// ...or at least this often.
const INTERVAL: Duration = Duration::from_millis(100);

/// Picks text deltas out of a byte stream of server-sent events.
#[derive(Default)]
pub(crate) struct TextDeltas {
    pending: Vec<u8>,
}

impl TextDeltas {
    /// The text in the events `chunk` completes. Most chunks end on an event's
    /// boundary: they are read in place, and only an unfinished tail is kept.
    pub(crate) fn feed(&mut self, api: Api, chunk: &[u8]) -> String {
        let buffered;
        let bytes: &[u8] = if self.pending.is_empty() {
            chunk
        } else {
            self.pending.extend_from_slice(chunk);
            buffered = std::mem::take(&mut self.pending);
            &buffered
        };
        let mut text = String::new();
        let mut at = 0;
        while let Some(end) = find_event_end(&bytes[at..]) {
            for line in bytes[at..at + end].split(|b| *b == b'\n') {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                if let Some(data) = line.strip_prefix(b"data:") {
                    if let Ok(doc) = serde_json::from_slice::<Value>(data.trim_ascii()) {
                        text.push_str(delta_text(api, &doc));
                    }
                }
            }
            at += end;
        }
        self.pending = bytes[at..].to_vec();
        text
    }
}

/// Where the first complete event ends (after its blank line).
fn find_event_end(bytes: &[u8]) -> Option<usize> {
    let lf = bytes.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The text one event adds, in the API's own shape.
fn delta_text(api: Api, doc: &Value) -> &str {
    let text = match api {
        Api::AnthropicMessages => (doc["type"] == "content_block_delta"
            && doc["delta"]["type"] == "text_delta")
            .then(|| doc["delta"]["text"].as_str())
            .flatten(),
        Api::OpenAiChat => doc["choices"][0]["delta"]["content"].as_str(),
        Api::OpenAiResponses => (doc["type"] == "response.output_text.delta")
            .then(|| doc["delta"].as_str())
            .flatten(),
        Api::AnthropicCountTokens => None,
    };
    text.unwrap_or_default()
}

/// Journals one exchange's text in pieces, off the relay's path: the relay hands it
/// text and goes on forwarding bytes; [`DeltaWriter::finish`] writes what is left.
pub(crate) struct DeltaWriter {
    tx: tokio::sync::mpsc::UnboundedSender<String>,
    task: tokio::task::JoinHandle<()>,
}

impl DeltaWriter {
    pub(crate) fn start<W: World>(live: Arc<LiveSession<W>>, call_id: String) -> Self {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let task = tokio::spawn(tracing::Instrument::in_current_span(async move {
            let mut buffer = String::new();
            let mut since = Instant::now();
            let mut open = true;
            while open {
                match rx.recv().await {
                    Some(text) => buffer.push_str(&text),
                    None => open = false,
                }
                let due = buffer.len() >= BATCH || since.elapsed() >= INTERVAL || !open;
                if due && !buffer.is_empty() {
                    let event = Event::ModelDelta {
                        call_id: call_id.clone(),
                        text: std::mem::take(&mut buffer),
                        restart: false,
                    };
                    if let Err(e) = live.append(&[event]).await {
                        tracing::debug!(error = %e, "journaling streamed text failed");
                    }
                    since = Instant::now();
                }
            }
        }));
        DeltaWriter { tx, task }
    }

    pub(crate) fn push(&self, text: String) {
        if !text.is_empty() {
            let _ = self.tx.send(text);
        }
    }

    /// Writes what is left; the pieces are in the log, in order, when it returns.
    pub(crate) async fn finish(self) {
        drop(self.tx);
        let _ = self.task.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_picked_out_of_each_api_s_events_across_chunk_boundaries() {
        let anthropic = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"lo\"}}\n\n";
        let mut d = TextDeltas::default();
        let (a, b) = anthropic.as_bytes().split_at(40);
        let mut text = d.feed(Api::AnthropicMessages, a);
        text += &d.feed(Api::AnthropicMessages, b);
        assert_eq!(text, "Hello");
        let chat =
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\r\n\r\ndata: [DONE]\r\n\r\n";
        assert_eq!(
            TextDeltas::default().feed(Api::OpenAiChat, chat.as_bytes()),
            "Hi"
        );
        let responses = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Yo\"}\n\n";
        assert_eq!(
            TextDeltas::default().feed(Api::OpenAiResponses, responses.as_bytes()),
            "Yo"
        );
    }
}
