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
    ("gpt-5-nano", 0.05, 0.4),
    ("gpt-5-mini", 0.25, 2.0),
    ("gpt-5", 1.25, 10.0),
    ("gpt-4.1-mini", 0.4, 1.6),
    ("gpt-4.1", 2.0, 8.0),
    ("gpt-4o-mini", 0.15, 0.6),
    ("gpt-4o", 2.5, 10.0),
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

/// The cost of a call in millionths of a dollar. Cache reads cost a tenth of input,
/// cache writes a quarter more. Unknown models cost 0 (and are logged as such).
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
}
