//! The stored form of an event: schema version, body and checksum.
//!
//! A record's checksum is BLAKE3 over the session id, position, lease epoch, time,
//! schema version and body, so a flipped byte anywhere, or a record copied to another
//! position or session, fails verification. Records written by an older schema are
//! upcast on decode; records from a newer one fail with a clear message.

use serde::{Deserialize, Serialize};

use crate::event::Event;

/// The schema version this code writes.
///
/// - 1: events internally tagged (`{"type": "user_message", ...}`), blocks likewise.
/// - 2: events and blocks externally tagged (`{"user_message": {...}}`), which
///   decodes several times faster; new events and optional fields for the server.
pub const SCHEMA_VERSION: u16 = 2;

/// An event with its place in the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Position in the session's log, from 1, without gaps.
    pub seq: u64,
    /// The lease epoch of the writer that appended it.
    pub epoch: u64,
    /// When it was appended, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The event.
    pub event: Event,
}

/// A record as bytes, ready for a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedRecord {
    /// The schema version the body is written in.
    pub schema: u16,
    /// The event as JSON.
    pub body: Vec<u8>,
    /// BLAKE3 checksum, hex.
    pub checksum: String,
}

/// Why a stored record could not be turned back into an event.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    /// The bytes do not match their checksum: torn or corrupted storage.
    #[error("corrupt record at {session}#{seq}: checksum mismatch (stored {stored}, computed {computed})")]
    ChecksumMismatch {
        /// The session.
        session: String,
        /// The position.
        seq: u64,
        /// The checksum stored with the record.
        stored: String,
        /// The checksum of the bytes read.
        computed: String,
    },
    /// Written by a newer Steadfast than this one.
    #[error("record at {session}#{seq} has schema version {schema}, newer than this build's {SCHEMA_VERSION}; upgrade steadfast to read this log")]
    TooNew {
        /// The session.
        session: String,
        /// The position.
        seq: u64,
        /// The record's schema version.
        schema: u16,
    },
    /// The checksum matched but the body is not a valid event for its schema.
    #[error("record at {session}#{seq} (schema {schema}) does not decode: {reason}")]
    Undecodable {
        /// The session.
        session: String,
        /// The position.
        seq: u64,
        /// The record's schema version.
        schema: u16,
        /// The decoder's message.
        reason: String,
    },
}

fn checksum(session: &str, seq: u64, epoch: u64, at_ms: u64, schema: u16, body: &[u8]) -> String {
    let mut hasher = blake3::Hasher::new();
    hasher.update(session.as_bytes());
    hasher.update(&[0]);
    hasher.update(&seq.to_le_bytes());
    hasher.update(&epoch.to_le_bytes());
    hasher.update(&at_ms.to_le_bytes());
    hasher.update(&schema.to_le_bytes());
    hasher.update(body);
    hex::encode(&hasher.finalize().as_bytes()[..16])
}

/// Encodes a record of `session` for storage.
pub fn encode(session: &str, record: &Record) -> EncodedRecord {
    let body = serde_json::to_vec(&record.event).expect("events always serialize");
    EncodedRecord {
        schema: SCHEMA_VERSION,
        checksum: checksum_of(session, record, &body),
        body,
    }
}

/// The checksum [`encode`] stores, for a record whose event is serialised already
/// (`body` must be `serde_json::to_vec(&record.event)`, written in
/// [`SCHEMA_VERSION`]): the worlds serialise each event once, both to decide whether
/// its body goes to the blob store and to store it.
pub fn checksum_of(session: &str, record: &Record, body: &[u8]) -> String {
    checksum(
        session,
        record.seq,
        record.epoch,
        record.at_ms,
        SCHEMA_VERSION,
        body,
    )
}

/// Verifies and decodes a stored record, upcasting old schema versions.
pub fn decode(
    session: &str,
    seq: u64,
    epoch: u64,
    at_ms: u64,
    stored: &EncodedRecord,
) -> Result<Record, CodecError> {
    let computed = checksum(session, seq, epoch, at_ms, stored.schema, &stored.body);
    if computed != stored.checksum {
        return Err(CodecError::ChecksumMismatch {
            session: session.to_string(),
            seq,
            stored: stored.checksum.clone(),
            computed,
        });
    }
    if stored.schema > SCHEMA_VERSION {
        return Err(CodecError::TooNew {
            session: session.to_string(),
            seq,
            schema: stored.schema,
        });
    }
    let undecodable = |reason: String| CodecError::Undecodable {
        session: session.to_string(),
        seq,
        schema: stored.schema,
        reason,
    };
    let event = if stored.schema == SCHEMA_VERSION {
        // The common case: straight from bytes to the event, no intermediate tree.
        serde_json::from_slice(&stored.body).map_err(|e| undecodable(e.to_string()))?
    } else {
        let value: serde_json::Value =
            serde_json::from_slice(&stored.body).map_err(|e| undecodable(e.to_string()))?;
        let value = upcast(stored.schema, value).map_err(undecodable)?;
        serde_json::from_value(value).map_err(|e| undecodable(e.to_string()))?
    };
    Ok(Record {
        seq,
        epoch,
        at_ms,
        event,
    })
}

/// Rewrites an event body of an older schema into the current one, one version at a
/// time. Each schema change adds a step here and a test that an old body still folds.
fn upcast(schema: u16, mut value: serde_json::Value) -> Result<serde_json::Value, String> {
    let mut version = schema;
    while version < SCHEMA_VERSION {
        value = match version {
            1 => v1_to_v2(value)?,
            other => return Err(format!("no upcaster from schema version {other}")),
        };
        version += 1;
    }
    Ok(value)
}

/// Moves an internal `"type"` tag outside: `{"type": "k", ...}` -> `{"k": {...}}`.
fn retag(value: serde_json::Value) -> Result<serde_json::Value, String> {
    let serde_json::Value::Object(mut fields) = value else {
        return Err("expected an object".into());
    };
    let Some(serde_json::Value::String(kind)) = fields.remove("type") else {
        return Err("no \"type\" tag".into());
    };
    // For `Block::ToolUse`, a newtype variant, the remaining fields are the `ToolUse`.
    Ok(serde_json::json!({ kind: serde_json::Value::Object(fields) }))
}

/// Schema 1 -> 2: events and message blocks become externally tagged.
fn v1_to_v2(value: serde_json::Value) -> Result<serde_json::Value, String> {
    let mut event = retag(value)?;
    if let Some(outcome) = event.get_mut("model_call_outcome") {
        if let Some(serde_json::Value::Array(blocks)) = outcome.get_mut("content") {
            for block in blocks.iter_mut() {
                *block = retag(block.take())?;
            }
        }
    }
    Ok(event)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, ModelSpec};
    use proptest::prelude::*;

    fn record(seq: u64, text: String) -> Record {
        Record {
            seq,
            epoch: 3,
            at_ms: 1_700_000_000_000,
            event: Event::UserMessage {
                turn: 1,
                text,
                inbox_id: None,
            },
        }
    }

    proptest! {
        #[test]
        fn roundtrips_any_text(text in ".*", seq in 1u64..1_000_000) {
            let rec = record(seq, text);
            let enc = encode("s1", &rec);
            prop_assert_eq!(decode("s1", seq, 3, rec.at_ms, &enc).unwrap(), rec);
        }

        #[test]
        fn any_flipped_byte_is_detected(text in ".{1,64}", at in any::<prop::sample::Index>(), bit in 0u8..8) {
            let rec = record(7, text);
            let mut enc = encode("s1", &rec);
            let i = at.index(enc.body.len());
            enc.body[i] ^= 1 << bit;
            let is_checksum_error = matches!(
                decode("s1", 7, 3, rec.at_ms, &enc),
                Err(CodecError::ChecksumMismatch { .. })
            );
            prop_assert!(is_checksum_error);
        }
    }

    #[test]
    fn record_moved_to_another_position_is_detected() {
        let rec = record(7, "hello".into());
        let enc = encode("s1", &rec);
        assert!(decode("s1", 8, 3, rec.at_ms, &enc).is_err());
        assert!(decode("s2", 7, 3, rec.at_ms, &enc).is_err());
        assert!(decode("s1", 7, 4, rec.at_ms, &enc).is_err());
    }

    #[test]
    fn schema_1_records_still_decode() {
        // Bodies exactly as schema 1 wrote them.
        let old = [
            (
                r#"{"type":"user_message","turn":1,"text":"fix it"}"#,
                "user_message",
            ),
            (
                r#"{"type":"model_call_outcome","call_id":"mc_1","content":[{"type":"text","text":"Looking."},{"type":"tool_use","id":"toolu_1","name":"read","input":{"file_path":"a"}}],"stop_reason":"tool_use","usage":{"input_tokens":5,"output_tokens":2},"cost_micro_usd":3}"#,
                "model_call_outcome",
            ),
            (
                r#"{"type":"tool_call_outcome","call_id":"toolu_1","is_error":false,"exit_code":null,"output":{"kind":"inline","text":"x"},"snapshot_after":null}"#,
                "tool_call_outcome",
            ),
        ];
        for (seq, (body, kind)) in old.iter().enumerate() {
            let seq = seq as u64 + 1;
            let body = body.as_bytes().to_vec();
            let stored = EncodedRecord {
                schema: 1,
                checksum: checksum("s", seq, 1, 9, 1, &body),
                body,
            };
            let record = decode("s", seq, 1, 9, &stored).unwrap();
            assert_eq!(record.event.kind(), *kind);
            if let Event::ModelCallOutcome { content, .. } = &record.event {
                assert_eq!(content.len(), 2);
                assert!(matches!(&content[1], crate::Block::ToolUse(t) if t.name == "read"));
            }
        }
    }

    #[test]
    fn newer_schema_fails_clearly() {
        let rec = Record {
            seq: 1,
            epoch: 1,
            at_ms: 5,
            event: Event::SessionStarted {
                agent: "native".into(),
                agent_cli: None,
                model: ModelSpec {
                    provider: "fake".into(),
                    model: "m".into(),
                },
                workspace: "/w".into(),
                host: None,
                system: String::new(),
                instructions: None,
                initial_snapshot: None,
                created_at_ms: 5,
                budget_micro_usd: None,
                approve_external: false,
                approval: Vec::new(),
                limits: Default::default(),
                network: None,
                client_tools: Vec::new(),
                egress_credentials: Vec::new(),
                git: None,
                mcp_servers: Vec::new(),
                explorers: 0,
            },
        };
        let mut enc = encode("s", &rec);
        enc.schema = SCHEMA_VERSION + 1;
        enc.checksum = checksum("s", 1, 1, 5, enc.schema, &enc.body);
        let err = decode("s", 1, 1, 5, &enc).unwrap_err();
        assert!(matches!(err, CodecError::TooNew { .. }));
        assert!(err.to_string().contains("upgrade steadfast"));
    }
}
