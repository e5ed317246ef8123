//! Logs written by earlier builds still fold under this one: a session's stored
//! records, checked in as they were written (schema version, checksum and all), are
//! decoded and folded, and a checkpoint of another format is set aside for the log.

use serde_json::Value;
use steadfast_log::fold::{Checkpoint, CHECKPOINT_VERSION};
use steadfast_log::record::{self, EncodedRecord};
use steadfast_log::{fold, BlobRef, Event, Next, Phase, Record, Status};

/// The records of `fixtures/<name>.jsonl`: one stored record a line, as a SQLite
/// world keeps it.
fn stored(name: &str) -> (String, Vec<Record>) {
    let path = format!("{}/tests/fixtures/{name}.jsonl", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("the fixture is checked in");
    let mut session = String::new();
    let records = text
        .lines()
        .map(|line| {
            let row: Value = serde_json::from_str(line).unwrap();
            let num = |key: &str| row[key].as_u64().unwrap();
            session = row["session"].as_str().unwrap().to_string();
            let encoded = EncodedRecord {
                schema: num("schema") as u16,
                body: row["body"].as_str().unwrap().as_bytes().to_vec(),
                checksum: row["checksum"].as_str().unwrap().to_string(),
            };
            record::decode(&session, num("seq"), num("epoch"), num("at_ms"), &encoded)
                .unwrap_or_else(|e| panic!("{path}: {e}"))
        })
        .collect();
    (session, records)
}

#[test]
fn a_native_session_written_before_phases_folds() {
    let (_, records) = stored("native-session");
    assert_eq!(records.len(), 42);
    let state = fold(&records).expect("the old log folds");
    assert_eq!(state.status(), Status::Completed);
    assert!(matches!(state.phase, Phase::Ended { .. }));
    assert_eq!(state.next(), Next::Ended(Status::Completed));
    assert_eq!(
        (state.turn, state.model_calls, state.model_attempts),
        (1, 8, 8)
    );
    assert!(state.pending_model.is_none() && state.pending_tools.is_empty());
    assert!(state.waiting().is_none() && state.escalated_by().is_none());
    assert!(
        state.last_snapshot.is_some(),
        "the workspace's last snapshot"
    );
    assert!(state.last_reply().is_some_and(|r| !r.is_empty()));
    // Each step of the way folds too, and reads as the event-only status says.
    let mut by_events = None;
    for end in 1..=records.len() {
        let state = fold(&records[..end]).unwrap();
        by_events = Status::after(&records[end - 1].event).or(by_events);
        assert_eq!(Some(state.status()), by_events, "after #{end}");
    }
}

#[test]
fn a_checkpoint_of_another_format_is_set_aside_and_one_of_this_format_resumes() {
    let (_, records) = stored("native-session");
    let whole = fold(&records).unwrap();
    // A checkpoint after the first 20 records, recorded as the 21st: the log goes on
    // from there, renumbered after it.
    let before = fold(&records[..20]).unwrap();
    let checkpoint = Record {
        seq: 21,
        epoch: 1,
        at_ms: 0,
        event: Event::Checkpoint {
            blob: BlobRef {
                hash: "unused".into(),
                size: 0,
                uri: String::new(),
                head: String::new(),
                tail: String::new(),
            },
            version: CHECKPOINT_VERSION,
        },
    };
    let rest: Vec<Record> = std::iter::once(checkpoint)
        .chain(records[20..].iter().enumerate().map(|(i, r)| Record {
            seq: 22 + i as u64,
            ..r.clone()
        }))
        .collect();
    let bytes = |version: u32| {
        serde_json::to_vec(&Checkpoint {
            version,
            state: before.clone(),
        })
        .unwrap()
    };
    let resumed = Checkpoint::resume(&bytes(CHECKPOINT_VERSION), &rest)
        .expect("a checkpoint of this format is used")
        .unwrap();
    assert_eq!(resumed.status(), whole.status());
    assert_eq!(resumed.conversation, whole.conversation);
    assert_eq!(resumed.last_checkpoint, 21);
    assert!(
        Checkpoint::resume(&bytes(CHECKPOINT_VERSION - 1), &rest).is_none(),
        "a checkpoint of the format before phases is ignored: the log is folded in full"
    );
}
