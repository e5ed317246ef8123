//! The output limit a request asks for, in each API's own field, and the request with a
//! lower one: how a wrapped CLI's call is fitted to its session's spend cap
//! (`steadfast_journal::spend`) without the CLI knowing.

use bytes::Bytes;
use serde_json::Value;

use crate::Api;

/// The fields that limit a reply's tokens in `api`'s requests (OpenAI's chat API has a
/// newer and an older one; either may be sent).
fn fields(api: Api) -> &'static [&'static str] {
    match api {
        Api::AnthropicMessages => &["max_tokens"],
        Api::OpenAiChat => &["max_completion_tokens", "max_tokens"],
        Api::OpenAiResponses => &["max_output_tokens"],
        Api::AnthropicCountTokens => &[],
    }
}

/// The most output tokens `request` asks for: the least of its limiting fields, `None`
/// when it sets none (the provider's own maximum applies, which is no bound).
pub(crate) fn asked(api: Api, request: &Value) -> Option<u32> {
    fields(api)
        .iter()
        .filter_map(|field| request.get(*field).and_then(Value::as_u64))
        .min()
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// The body of `request` asking for at most `tokens` of output: every limiting field it
/// sets is lowered, or the API's first field is set when it sets none.
pub(crate) fn lowered(api: Api, request: &Value, tokens: u32) -> Bytes {
    let mut request = request.clone();
    if let Some(object) = request.as_object_mut() {
        let present: Vec<&str> = fields(api)
            .iter()
            .copied()
            .filter(|field| object.contains_key(*field))
            .collect();
        let set = if present.is_empty() {
            fields(api).get(..1).unwrap_or_default()
        } else {
            &present[..]
        };
        for field in set {
            object.insert((*field).to_string(), Value::from(tokens));
        }
        if api == Api::AnthropicMessages {
            fit_thinking(object, tokens);
        }
    }
    Bytes::from(request.to_string())
}

/// The least thinking budget Anthropic's API takes.
const MIN_THINKING_BUDGET: u64 = 1024;

/// Anthropic's extended thinking spends a budget out of `max_tokens` and refuses a
/// budget that is not below it: lowered with it, or, when not even the least budget
/// fits under `tokens`, thinking is left off for this call.
fn fit_thinking(object: &mut serde_json::Map<String, Value>, tokens: u32) {
    let Some(budget) = object
        .get("thinking")
        .and_then(|t| t.get("budget_tokens"))
        .and_then(Value::as_u64)
    else {
        return;
    };
    let tokens = u64::from(tokens);
    if budget < tokens {
        return;
    }
    if tokens > MIN_THINKING_BUDGET {
        object["thinking"]["budget_tokens"] = Value::from((tokens - 1).max(MIN_THINKING_BUDGET));
    } else {
        object.remove("thinking");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_api_is_limited_in_its_own_field() {
        let claude = json!({"model": "m", "max_tokens": 32000, "messages": []});
        assert_eq!(asked(Api::AnthropicMessages, &claude), Some(32000));
        let body: Value =
            serde_json::from_slice(&lowered(Api::AnthropicMessages, &claude, 900)).unwrap();
        assert_eq!(body["max_tokens"], 900);
        assert_eq!(body["messages"], json!([]));

        let chat = json!({"model": "m", "max_tokens": 500, "max_completion_tokens": 800});
        assert_eq!(
            asked(Api::OpenAiChat, &chat),
            Some(500),
            "the least of both"
        );
        let body: Value = serde_json::from_slice(&lowered(Api::OpenAiChat, &chat, 400)).unwrap();
        assert_eq!(
            (
                body["max_tokens"].clone(),
                body["max_completion_tokens"].clone()
            ),
            (json!(400), json!(400))
        );
        let old = json!({"model": "m", "max_tokens": 500});
        let body: Value = serde_json::from_slice(&lowered(Api::OpenAiChat, &old, 400)).unwrap();
        assert_eq!(
            body,
            json!({"model": "m", "max_tokens": 400}),
            "the field it uses"
        );

        // Claude Code thinks with a budget out of its max_tokens: lowered below it, or
        // left off when not even Anthropic's least budget fits.
        let thinking = json!({"model": "m", "max_tokens": 32000,
                              "thinking": {"type": "enabled", "budget_tokens": 31999}});
        let body: Value =
            serde_json::from_slice(&lowered(Api::AnthropicMessages, &thinking, 3000)).unwrap();
        assert_eq!(
            (
                body["max_tokens"].clone(),
                body["thinking"]["budget_tokens"].clone()
            ),
            (json!(3000), json!(2999))
        );
        let body: Value =
            serde_json::from_slice(&lowered(Api::AnthropicMessages, &thinking, 1024)).unwrap();
        assert!(body.get("thinking").is_none(), "{body}");
        let small = json!({"model": "m", "max_tokens": 32000,
                           "thinking": {"type": "enabled", "budget_tokens": 2000}});
        let body: Value =
            serde_json::from_slice(&lowered(Api::AnthropicMessages, &small, 3000)).unwrap();
        assert_eq!(
            body["thinking"]["budget_tokens"], 2000,
            "a budget that fits is kept"
        );

        let open = json!({"model": "m", "input": "hi"});
        assert_eq!(asked(Api::OpenAiResponses, &open), None, "no limit asked");
        let body: Value =
            serde_json::from_slice(&lowered(Api::OpenAiResponses, &open, 300)).unwrap();
        assert_eq!(body["max_output_tokens"], 300);
        let bare = json!({"model": "m", "messages": []});
        let body: Value = serde_json::from_slice(&lowered(Api::OpenAiChat, &bare, 7)).unwrap();
        assert_eq!(body["max_completion_tokens"], 7);
        assert!(body.get("max_tokens").is_none());
    }
}
