//! Model prices, for the cost recorded with every model call.

use steadfast_log::Usage;

/// USD per million tokens: input, output. Matched by model-name prefix, longest first.
const PRICES: &[(&str, f64, f64)] = &[
    ("claude-opus-4-5", 5.0, 25.0),
    ("claude-opus-4-6", 5.0, 25.0),
    ("claude-opus", 15.0, 75.0),
    ("claude-sonnet", 3.0, 15.0),
    ("claude-haiku-4", 1.0, 5.0),
    ("claude-3-5-haiku", 0.8, 4.0),
    ("claude-3-7-sonnet", 3.0, 15.0),
    ("claude-3-5-sonnet", 3.0, 15.0),
    ("claude-3-opus", 15.0, 75.0),
    ("claude-3-haiku", 0.25, 1.25),
    ("gpt-5-nano", 0.05, 0.4),
    ("gpt-5-mini", 0.25, 2.0),
    ("gpt-5", 1.25, 10.0),
    ("gpt-4.1-nano", 0.1, 0.4),
    ("gpt-4.1-mini", 0.4, 1.6),
    ("gpt-4.1", 2.0, 8.0),
    ("gpt-4o-mini", 0.15, 0.6),
    ("gpt-4o", 2.5, 10.0),
    ("gpt-4-turbo", 10.0, 30.0),
    ("gpt-3.5-turbo", 0.5, 1.5),
    ("o1-mini", 1.1, 4.4),
    ("o1", 15.0, 60.0),
    ("o3-mini", 1.1, 4.4),
    ("o3-pro", 20.0, 80.0),
    ("o3", 2.0, 8.0),
    ("o4-mini", 1.1, 4.4),
    ("codex-mini", 1.5, 6.0),
];

/// The price of `model` (USD per million input and output tokens), if known.
pub fn price(model: &str) -> Option<(f64, f64)> {
    PRICES
        .iter()
        .filter(|(prefix, _, _)| model.starts_with(prefix))
        .max_by_key(|(prefix, _, _)| prefix.len())
        .map(|(_, i, o)| (*i, *o))
}

/// Prices a deployment sets for itself (negotiated rates, models the built-in table
/// does not know): model-name prefix to USD per million input and output tokens.
/// Longest prefix wins; consulted before the built-in table.
pub type PriceTable = std::collections::BTreeMap<String, (f64, f64)>;

/// Whether calls to `model` of `provider` have a price (in `table` or the built-in
/// one). The fake provider's models are free, which is a price. A money bound on an
/// unpriced model could never trip, so sessions with one are refused.
pub fn is_priced(table: &PriceTable, provider: &str, model: &str) -> bool {
    provider == "fake"
        || table
            .keys()
            .any(|prefix| model.starts_with(prefix.as_str()))
        || price(model).is_some()
}

/// The cost of a call in millionths of a dollar. Cache reads cost a tenth of input,
/// cache writes a quarter more. Unknown models cost 0: check [`is_priced`] before
/// trusting a money bound.
pub fn cost_micro_usd(model: &str, usage: &Usage) -> u64 {
    cost_with(&PriceTable::new(), model, usage)
}

/// [`cost_micro_usd`] with `table` consulted first.
pub fn cost_with(table: &PriceTable, model: &str, usage: &Usage) -> u64 {
    let custom = table
        .iter()
        .filter(|(prefix, _)| model.starts_with(prefix.as_str()))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, p)| *p);
    let Some((input, output)) = custom.or_else(|| price(model)) else {
        return 0;
    };
    // USD per million tokens is exactly micro-USD per token.
    let micro = usage.input_tokens as f64 * input
        + usage.output_tokens as f64 * output
        + usage.cache_read_tokens as f64 * input * 0.1
        + usage.cache_write_tokens as f64 * input * 1.25;
    micro.round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_wins() {
        assert_eq!(price("gpt-5-mini-2025"), Some((0.25, 2.0)));
        assert_eq!(price("gpt-5"), Some((1.25, 10.0)));
        assert_eq!(price("claude-sonnet-4-5"), Some((3.0, 15.0)));
        assert_eq!(price("mystery"), None);
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 1000,
            ..Usage::default()
        };
        assert_eq!(cost_micro_usd("claude-sonnet-4-5", &usage), 3_015_000);
        let table = PriceTable::from([("claude-sonnet-4".to_string(), (1.0, 1.0))]);
        assert_eq!(cost_with(&table, "claude-sonnet-4-5", &usage), 1_001_000);
        assert_eq!(cost_with(&table, "house-model", &usage), 0);
    }

    #[test]
    fn current_models_are_priced_and_unknown_ones_say_so() {
        for model in [
            "claude-3-7-sonnet-20250219",
            "claude-3-5-sonnet-latest",
            "claude-sonnet-4-5",
            "claude-opus-4-1",
            "claude-haiku-4-5",
            "o3",
            "o3-mini",
            "o4-mini",
            "gpt-4.1-nano",
            "gpt-5-codex",
        ] {
            assert!(is_priced(&PriceTable::new(), "x", model), "{model}");
        }
        assert_eq!(price("o3-mini-2025"), Some((1.1, 4.4)), "longest prefix");
        assert!(!is_priced(&PriceTable::new(), "anthropic", "house-model"));
        let table = PriceTable::from([("house-".to_string(), (1.0, 1.0))]);
        assert!(is_priced(&table, "anthropic", "house-model"));
        assert!(
            is_priced(&PriceTable::new(), "fake", "m"),
            "the fake provider is free"
        );
    }
}
