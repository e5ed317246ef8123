//! Which model API a wrapped agent's request went to, as the gateway records it.

use serde::{Deserialize, Serialize};

/// A model API a wrapped agent's request went to, by the name the log keeps it
/// under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
pub enum Api {
    /// Anthropic's Messages API.
    #[serde(rename = "anthropic.messages")]
    AnthropicMessages,
    /// Anthropic's token count.
    #[serde(rename = "anthropic.count_tokens")]
    AnthropicCountTokens,
    /// OpenAI's Chat Completions API.
    #[serde(rename = "openai.chat")]
    OpenAiChat,
    /// OpenAI's Responses API.
    #[serde(rename = "openai.responses")]
    OpenAiResponses,
}

impl Api {
    /// Its name as recorded: `anthropic.messages`, `anthropic.count_tokens`,
    /// `openai.chat`, `openai.responses`.
    pub fn name(self) -> &'static str {
        match self {
            Api::AnthropicMessages => "anthropic.messages",
            Api::AnthropicCountTokens => "anthropic.count_tokens",
            Api::OpenAiChat => "openai.chat",
            Api::OpenAiResponses => "openai.responses",
        }
    }

    /// Whether it is one of Anthropic's.
    pub fn is_anthropic(self) -> bool {
        matches!(self, Api::AnthropicMessages | Api::AnthropicCountTokens)
    }

    /// The provider whose API it is (`anthropic`, `openai`).
    pub fn provider(self) -> &'static str {
        if self.is_anthropic() {
            "anthropic"
        } else {
            "openai"
        }
    }
}

impl std::fmt::Display for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_api_is_stored_and_published_by_its_name() {
        for api in [
            Api::AnthropicMessages,
            Api::AnthropicCountTokens,
            Api::OpenAiChat,
            Api::OpenAiResponses,
        ] {
            let json = serde_json::to_value(api).unwrap();
            assert_eq!(json, serde_json::json!(api.name()));
            assert_eq!(serde_json::from_value::<Api>(json).unwrap(), api);
            assert!(api.name().starts_with(api.provider()));
        }
    }
}
