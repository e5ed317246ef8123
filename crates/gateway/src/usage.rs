//! What a recorded reply says it consumed, in each API's own words.

use serde_json::Value;
use steadfast_log::Usage;

use crate::Api;

fn n(v: &Value, path: &[&str]) -> u64 {
    path.iter()
        .try_fold(v, |v, k| v.get(*k))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// The JSON objects of a reply: the body itself, or each event of a stream.
fn documents(body: &str) -> Vec<Value> {
    match serde_json::from_str::<Value>(body) {
        Ok(v) => vec![v],
        Err(_) => body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect(),
    }
}

/// The usage a reply reports, if it reports any.
pub(crate) fn of_reply(api: Api, body: &str) -> Option<Usage> {
    let mut usage = Usage::default();
    let mut seen = false;
    for doc in documents(body) {
        let found = match api {
            Api::AnthropicMessages => doc
                .get("usage")
                .or_else(|| doc.get("message").and_then(|m| m.get("usage"))),
            Api::OpenAiChat => doc.get("usage"),
            Api::OpenAiResponses => doc
                .get("usage")
                .or_else(|| doc.get("response").and_then(|r| r.get("usage"))),
            Api::AnthropicCountTokens => None,
        };
        let Some(u) = found.filter(|u| u.is_object()) else {
            continue;
        };
        seen = true;
        match api {
            Api::AnthropicMessages => {
                // message_start carries the input side; message_delta the final output.
                usage.input_tokens = usage.input_tokens.max(n(u, &["input_tokens"]));
                usage.output_tokens = usage.output_tokens.max(n(u, &["output_tokens"]));
                usage.cache_read_tokens = usage
                    .cache_read_tokens
                    .max(n(u, &["cache_read_input_tokens"]));
                usage.cache_write_tokens = usage
                    .cache_write_tokens
                    .max(n(u, &["cache_creation_input_tokens"]));
            }
            Api::OpenAiChat => {
                let cached = n(u, &["prompt_tokens_details", "cached_tokens"]);
                usage.input_tokens = n(u, &["prompt_tokens"]).saturating_sub(cached);
                usage.cache_read_tokens = cached;
                usage.output_tokens = n(u, &["completion_tokens"]);
            }
            Api::OpenAiResponses => {
                let cached = n(u, &["input_tokens_details", "cached_tokens"]);
                usage.input_tokens = n(u, &["input_tokens"]).saturating_sub(cached);
                usage.cache_read_tokens = cached;
                usage.output_tokens = n(u, &["output_tokens"]);
            }
            Api::AnthropicCountTokens => {}
        }
    }
    seen.then_some(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_read_from_whole_and_streamed_replies_of_each_api() {
        let stream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":100,\"cache_read_input_tokens\":7,\"output_tokens\":1}}}\n\n\
                      event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":42}}\n\n";
        let u = of_reply(Api::AnthropicMessages, stream).unwrap();
        assert_eq!(
            (u.input_tokens, u.output_tokens, u.cache_read_tokens),
            (100, 42, 7)
        );
        let chat = r#"{"usage": {"prompt_tokens": 50, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 10}}}"#;
        let u = of_reply(Api::OpenAiChat, chat).unwrap();
        assert_eq!(
            (u.input_tokens, u.output_tokens, u.cache_read_tokens),
            (40, 5, 10)
        );
        let responses = "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":30,\"output_tokens\":3}}}\n\n";
        let u = of_reply(Api::OpenAiResponses, responses).unwrap();
        assert_eq!((u.input_tokens, u.output_tokens), (30, 3));
        assert!(of_reply(Api::AnthropicCountTokens, r#"{"input_tokens": 5}"#).is_none());
    }
}
