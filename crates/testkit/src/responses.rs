//! The OpenAI Responses wire format of the fake provider (what Codex speaks).

use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::Step;

/// The script step for a Responses request: model turns completed in `input` (a run
/// of assistant messages and function calls is one turn), not counting a turn whose
/// calls were rolled back.
pub(crate) fn step_index(input: &Value) -> usize {
    let Some(items) = input.as_array() else {
        return 0; // a plain string: the first turn
    };
    let mut index = 0;
    let mut in_turn = false;
    let mut redone = false;
    for item in items {
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        let role = item.get("role").and_then(Value::as_str);
        let from_model = matches!(kind, "function_call" | "reasoning")
            || (kind == "message" && role == Some("assistant"));
        if from_model {
            if !in_turn {
                index += 1;
                redone = false;
            }
            in_turn = true;
            continue;
        }
        in_turn = false;
        let rolled_back = kind == "function_call_output"
            && item
                .get("output")
                .is_some_and(crate::redo::content_rolled_back);
        if rolled_back && !redone && index > 0 {
            index -= 1;
            redone = true;
        }
    }
    index
}

fn output_items(index: usize, step: &Step) -> Vec<Value> {
    let mut items = Vec::new();
    if !step.text.is_empty() {
        items.push(json!({"type": "message", "id": format!("msg_fake_{index}"), "status": "completed",
            "role": "assistant", "content": [{"type": "output_text", "text": step.text, "annotations": []}]}));
    }
    for (j, call) in step.tool_calls.iter().enumerate() {
        let mut item = json!({"type": "function_call", "id": format!("fc_fake_{index}_{j}"),
            "call_id": format!("call_fake_{index}_{j}"), "name": call.name,
            "arguments": call.input.to_string(), "status": "completed"});
        // A tool of a namespace (`ns.tool`) is called by its own name within it.
        if let Some((namespace, name)) = call.name.rsplit_once('.') {
            item["name"] = json!(name);
            item["namespace"] = json!(namespace);
        }
        items.push(item);
    }
    items
}

fn response(index: usize, model: &str, status: &str, output: Vec<Value>, usage: Value) -> Value {
    json!({
        "id": format!("resp_fake_{index}"), "object": "response", "created_at": 0,
        "status": status, "model": model, "output": output, "usage": usage,
        "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
        "error": null, "incomplete_details": null, "instructions": null, "metadata": {},
        "temperature": 1.0, "top_p": 1.0, "text": {"format": {"type": "text"}},
    })
}

fn usage(input: u64, output: u64) -> Value {
    json!({"input_tokens": input, "input_tokens_details": {"cached_tokens": 0},
           "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
           "total_tokens": input + output})
}

/// The reply to a Responses request.
pub(crate) fn reply(index: usize, step: &Step, model: &str, input: u64, stream: bool) -> Response {
    let output = (step.text.len() / 4) as u64 + 12 * step.tool_calls.len() as u64 + 1;
    let items = output_items(index, step);
    if !stream {
        return Json(response(
            index,
            model,
            "completed",
            items,
            usage(input, output),
        ))
        .into_response();
    }
    let mut seq = 0u64;
    let mut frames = Vec::new();
    let mut emit = |kind: &str, mut data: Value| {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(seq);
        seq += 1;
        frames.push(format!("event: {kind}\ndata: {data}\n\n"));
    };
    let start = response(index, model, "in_progress", vec![], Value::Null);
    emit("response.created", json!({"response": start}));
    emit("response.in_progress", json!({"response": start}));
    for (i, item) in items.iter().enumerate() {
        let mut empty = item.clone();
        if item["type"] == "message" {
            empty["content"] = json!([]);
            empty["status"] = json!("in_progress");
            emit(
                "response.output_item.added",
                json!({"output_index": i, "item": empty}),
            );
            let id = item["id"].clone();
            emit(
                "response.content_part.added",
                json!({"item_id": id, "output_index": i, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []}}),
            );
            let text = item["content"][0]["text"].as_str().unwrap_or_default();
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(16) {
                emit(
                    "response.output_text.delta",
                    json!({"item_id": id, "output_index": i, "content_index": 0,
                    "delta": piece.iter().collect::<String>(), "logprobs": []}),
                );
            }
            emit(
                "response.output_text.done",
                json!({"item_id": id, "output_index": i, "content_index": 0, "text": text, "logprobs": []}),
            );
            emit(
                "response.content_part.done",
                json!({"item_id": id, "output_index": i, "content_index": 0,
                "part": item["content"][0]}),
            );
        } else {
            empty["arguments"] = json!("");
            empty["status"] = json!("in_progress");
            emit(
                "response.output_item.added",
                json!({"output_index": i, "item": empty}),
            );
            let args = item["arguments"].as_str().unwrap_or_default();
            emit(
                "response.function_call_arguments.delta",
                json!({"item_id": item["id"], "output_index": i, "delta": args}),
            );
            emit(
                "response.function_call_arguments.done",
                json!({"item_id": item["id"], "output_index": i, "arguments": args}),
            );
        }
        emit(
            "response.output_item.done",
            json!({"output_index": i, "item": item}),
        );
    }
    emit(
        "response.completed",
        json!({"response": response(index, model, "completed", items, usage(input, output))}),
    );
    crate::wire::event_stream(frames, step)
}

#[cfg(test)]
mod tests {
    use super::*;
    use steadfast_log::INTERRUPTED_ROLLED_BACK;

    #[test]
    fn a_rolled_back_result_counts_with_a_note_before_it_or_in_parts() {
        let call =
            json!({"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"});
        for output in [
            json!(format!(
                "Wall time: 0.1 seconds\nOutput:\n{INTERRUPTED_ROLLED_BACK}"
            )),
            json!([{"type": "input_text", "text": INTERRUPTED_ROLLED_BACK}]),
        ] {
            let input = json!([
                {"role": "user", "content": "go"},
                call,
                {"type": "function_call_output", "call_id": "c1", "output": output},
            ]);
            assert_eq!(
                step_index(&input),
                0,
                "the rolled-back step is asked again: {output}"
            );
        }
    }

    #[test]
    fn turns_are_counted_in_the_input() {
        assert_eq!(step_index(&json!("hello")), 0);
        let input = json!([
            {"role": "user", "content": "go"},
            {"type": "message", "role": "assistant", "content": []},
            {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            {"type": "function_call", "call_id": "c2", "name": "bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c2", "output": INTERRUPTED_ROLLED_BACK},
        ]);
        assert_eq!(
            step_index(&input),
            1,
            "the second turn was rolled back: repeat it"
        );
    }
}
