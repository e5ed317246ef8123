//! A wrapped agent's model requests, kept by content: each exchange's normalized request is in the blob
//! store as its frame (everything but the messages) and its messages, one blob each,
//! named by hash. A conversation's requests share most of their messages, so each
//! request's record names an earlier one it builds on and only the messages it adds:
//! the log and the store grow by what is new at each step, not by the whole
//! conversation again. A replay's divergence report reads a request back with [`load`].

use std::collections::{HashMap, HashSet, VecDeque};

use serde_json::Value;
use steadfast_log::{Event, Record, RequestParts};
use steadfast_world::Blobs;

/// Why a kept request could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The blob store failed.
    #[error(transparent)]
    World(#[from] steadfast_world::Error),
    /// What was kept does not make a request.
    #[error("kept request: {0}")]
    Corrupt(String),
}

/// The fields a request's messages are in (Anthropic Messages and OpenAI Chat:
/// `messages`; OpenAI Responses: `input`, when it is a list).
const MESSAGE_FIELDS: &[&str] = &["messages", "input"];

/// How many recent requests a new one may build on (side requests interleave with
/// the conversation's own).
const RECENT: usize = 8;

/// A request split for keeping: the frame's blob and bytes, and each message's.
pub(crate) struct Split {
    frame: (String, Vec<u8>),
    messages: Vec<(String, Vec<u8>)>,
}

/// Splits a normalized request into its frame (the messages' field left in place as
/// `null`, so the request is put back as it was) and its messages.
pub(crate) fn split(normalized: &Value) -> Split {
    let mut frame = normalized.clone();
    let mut messages = Vec::new();
    if let Value::Object(map) = &mut frame {
        if let Some(field) = MESSAGE_FIELDS
            .iter()
            .find(|f| map.get(**f).is_some_and(Value::is_array))
        {
            if let Some(Value::Array(list)) = map.insert((*field).to_string(), Value::Null) {
                messages = list.iter().map(blob).collect();
            }
        }
    }
    Split {
        frame: blob(&frame),
        messages,
    }
}

fn blob(value: &Value) -> (String, Vec<u8>) {
    let bytes = value.to_string().into_bytes();
    (blake3::hash(&bytes).to_hex().to_string(), bytes)
}

/// What one gateway remembers of the requests it kept: which blobs it has written (each
/// once) and the recent requests' messages (what a new request builds on).
#[derive(Default)]
pub(crate) struct Keeper {
    written: HashSet<String>,
    recent: VecDeque<(String, Vec<String>)>,
}

impl Keeper {
    /// The record of `split` and the blobs still to write for it. Remember it with
    /// [`Keeper::kept`] once its record is in the log (a base must be readable).
    pub(crate) fn parts(&self, split: &Split) -> (RequestParts, Vec<(String, Vec<u8>)>) {
        let hashes: Vec<&str> = split.messages.iter().map(|(h, _)| h.as_str()).collect();
        let base = self
            .recent
            .iter()
            .map(|(id, theirs)| {
                let shared = theirs
                    .iter()
                    .zip(&hashes)
                    .take_while(|(a, b)| a.as_str() == **b)
                    .count();
                (id, shared)
            })
            .filter(|(_, shared)| *shared > 0)
            // The last of the longest: the most recent.
            .max_by_key(|(_, shared)| *shared);
        let kept = base.map_or(0, |(_, shared)| shared);
        let parts = RequestParts {
            frame: split.frame.0.clone(),
            base: base.map(|(id, _)| id.clone()),
            kept: kept as u64,
            added: hashes[kept..].iter().map(|h| h.to_string()).collect(),
        };
        let mut unwritten = Vec::new();
        let mut seen = HashSet::new();
        for (hash, bytes) in std::iter::once(&split.frame).chain(&split.messages[kept..]) {
            if !self.written.contains(hash) && seen.insert(hash) {
                unwritten.push((hash.clone(), bytes.clone()));
            }
        }
        (parts, unwritten)
    }

    /// Notes that the request recorded as `call_id` is in the log with its blobs.
    pub(crate) fn kept(&mut self, call_id: &str, split: &Split) {
        self.written.insert(split.frame.0.clone());
        let hashes: Vec<String> = split.messages.iter().map(|(h, _)| h.clone()).collect();
        self.written.extend(hashes.iter().cloned());
        self.recent.push_back((call_id.to_string(), hashes));
        if self.recent.len() > RECENT {
            self.recent.pop_front();
        }
    }
}

/// Writes a request's unwritten blobs.
pub(crate) async fn write(
    blobs: &Blobs,
    unwritten: &[(String, Vec<u8>)],
) -> Result<(), steadfast_world::Error> {
    for (_, bytes) in unwritten {
        blobs.put_raw(bytes).await?;
    }
    Ok(())
}

/// The normalized request the exchange `call_id` recorded, read back from `records`
/// (the session's log, which names every request it builds on) and the blob store;
/// `None` when its log kept no request (it was written before requests were kept).
pub async fn load(
    blobs: &Blobs,
    records: &[Record],
    call_id: &str,
) -> Result<Option<Value>, Error> {
    let parts: HashMap<&str, &RequestParts> = records
        .iter()
        .filter_map(|r| match &r.event {
            Event::ExchangeIntent {
                call_id,
                request: Some(parts),
                ..
            } => Some((call_id.as_str(), parts)),
            _ => None,
        })
        .collect();
    let Some(target) = parts.get(call_id).copied() else {
        return Ok(None);
    };
    // The chain of requests this one builds on, back to one that names all its own.
    let mut chain = vec![target];
    while let Some(base) = chain.last().and_then(|p| p.base.as_deref()) {
        let Some(next) = parts.get(base).copied() else {
            return Ok(None);
        };
        if chain.len() > parts.len() {
            return Err(Error::Corrupt(format!(
                "request {call_id}: its bases form a cycle"
            )));
        }
        chain.push(next);
    }
    let mut hashes: Vec<&str> = Vec::new();
    for step in chain.iter().rev() {
        hashes.truncate(step.kept as usize);
        hashes.extend(step.added.iter().map(String::as_str));
    }
    let mut request = read(blobs, &target.frame).await?;
    let mut messages = Vec::with_capacity(hashes.len());
    for hash in hashes {
        messages.push(read(blobs, hash).await?);
    }
    if let Value::Object(map) = &mut request {
        if let Some(field) = MESSAGE_FIELDS
            .iter()
            .find(|f| map.get(**f) == Some(&Value::Null))
        {
            map.insert((*field).to_string(), Value::Array(messages));
        }
    }
    Ok(Some(request))
}

async fn read(blobs: &Blobs, hash: &str) -> Result<Value, Error> {
    let bytes = blobs.get(hash).await?;
    serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt(format!("blob {hash}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn intent(call_id: &str, parts: RequestParts) -> Record {
        Record {
            seq: 1,
            epoch: 0,
            at_ms: 0,
            event: Event::ExchangeIntent {
                call_id: call_id.into(),
                index: 0,
                api: steadfast_log::Api::AnthropicMessages,
                fingerprint: String::new(),
                stream: false,
                snapshot: None,
                request: Some(parts),
            },
        }
    }

    fn request(turns: usize) -> Value {
        let messages: Vec<Value> = (0..turns)
            .map(|i| json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": format!("message {i}")}))
            .collect();
        json!({"model": "m", "system": "be brief", "messages": messages, "max_tokens": 100})
    }

    /// A conversation's requests are kept by what each adds: every record names only
    /// the new messages, every blob is written once, and each request reads back
    /// whole, the same JSON (so the same fingerprint).
    #[tokio::test]
    async fn each_request_keeps_only_what_it_adds_and_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::local(dir.path()).unwrap();
        let mut keeper = Keeper::default();
        let mut records = Vec::new();
        let mut written = 0;
        for step in 1..=20 {
            let asked = request(step * 2 - 1);
            // A side request with its own one message, as Claude Code sends.
            let side =
                json!({"model": "small", "messages": [{"role": "user", "content": "title?"}]});
            for (id, value) in [(format!("c{step}"), &asked), (format!("s{step}"), &side)] {
                let split = split(value);
                let (parts, unwritten) = keeper.parts(&split);
                if id.starts_with('c') && step > 1 {
                    assert_eq!(parts.added.len(), 2, "step {step}: {parts:?}");
                    assert_eq!(
                        parts.base.as_deref(),
                        Some(format!("c{}", step - 1).as_str())
                    );
                }
                written += unwritten.len();
                write(&blobs, &unwritten).await.unwrap();
                records.push(intent(&id, parts));
                keeper.kept(&id, &split);
            }
        }
        // Two frames, 39 distinct conversation messages, one side message.
        assert_eq!(written, 2 + 39 + 1);
        for step in [1, 7, 20] {
            let back = load(&blobs, &records, &format!("c{step}"))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(back.to_string(), request(step * 2 - 1).to_string());
        }
        assert_eq!(load(&blobs, &records, "nope").await.unwrap(), None);
    }

    /// A request whose messages are no list (a Responses `input` string) is kept as
    /// its frame alone.
    #[tokio::test]
    async fn a_request_without_a_message_list_is_its_frame() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::local(dir.path()).unwrap();
        let asked = json!({"model": "gpt", "input": "hello"});
        let split = split(&asked);
        let (parts, unwritten) = Keeper::default().parts(&split);
        assert!(parts.added.is_empty() && parts.base.is_none());
        write(&blobs, &unwritten).await.unwrap();
        let back = load(&blobs, &[intent("x", parts)], "x").await.unwrap();
        assert_eq!(back, Some(asked));
    }
}
