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
    }
    Bytes::from(request.to_string())
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
