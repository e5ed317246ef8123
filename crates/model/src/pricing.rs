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
    let Some((input, output)) = price_with(table, model) else {
        return 0;
    };
    // USD per million tokens is exactly micro-USD per token.
    let micro = usage.input_tokens as f64 * input
        + usage.output_tokens as f64 * output
        + usage.cache_read_tokens as f64 * input * 0.1
        + usage.cache_write_tokens as f64 * input * 1.25;
    micro.round() as u64
}

/// Tokens a provider may add to a request beyond what its bytes say (a tool-use
/// preamble), counted into every call's worst case.
const UNSEEN_INPUT_TOKENS: u64 = 1024;

/// The fewest output tokens a call is lowered to before the session escalates instead:
/// a reply cut shorter is rarely worth its input.
pub const MIN_OUTPUT_TOKENS: u32 = 1024;

/// The output a request that sets no limit is counted as asking for: the most today's
/// models write in one reply. Lowering such a request sets a limit under it, which every
/// model accepts.
const UNASKED_OUTPUT_TOKENS: u32 = 128_000;

/// How much a model call may be asked to write so that its worst case fits in what is
/// left of a spend cap: a cap is a bound, so the call that would cross it is never made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputRoom {
    /// The call fits as asked.
    AsAsked,
    /// It fits with at most this many output tokens.
    AtMost(u32),
    /// Not even [`MIN_OUTPUT_TOKENS`] fit: the session escalates before the call.
    Over {
        /// The least the call could cost at worst (its input, and the fewest output
        /// tokens it would be made with), in millionths of a dollar.
        worst_case_micro_usd: u64,
    },
}

/// The [`OutputRoom`] of a call to `model` whose request is `request_bytes` long and
/// asks for at most `asked` output tokens (`None`: no limit asked), with
/// `left_micro_usd` of the cap left. A request that asks for no limit is counted as
/// asking for the most today's models write (128,000 tokens).
///
/// The worst case counts every byte of the request as a token (no tokenizer makes a
/// token of less than a byte), every input token as a cache write (the dearest input)
/// and every output token asked for. It overstates a typical call about fourfold on
/// input, which only matters near the cap, and it holds without knowing the tokenizer.
/// An unpriced model has no worst case: bounds on one are refused when set.
pub fn output_room(
    table: &PriceTable,
    model: &str,
    left_micro_usd: u64,
    request_bytes: usize,
    asked: Option<u32>,
) -> OutputRoom {
    let Some((input, output)) = price_with(table, model) else {
        return OutputRoom::AsAsked;
    };
    let input_worst = (request_bytes as u64 + UNSEEN_INPUT_TOKENS) as f64 * input * 1.25;
    let cost_of = |tokens: u32| (input_worst + f64::from(tokens) * output).ceil() as u64;
    let asked = asked.unwrap_or(UNASKED_OUTPUT_TOKENS);
    if cost_of(asked) <= left_micro_usd {
        return OutputRoom::AsAsked;
    }
    let floor = asked.min(MIN_OUTPUT_TOKENS);
    let spare = left_micro_usd as f64 - input_worst;
    let fits = if output > 0.0 {
        (spare / output).floor().clamp(0.0, f64::from(u32::MAX)) as u32
    } else if spare >= 0.0 {
        u32::MAX
    } else {
        0
    };
    let fits = fits.min(asked);
    if spare < 0.0 || fits < floor {
        return OutputRoom::Over {
            worst_case_micro_usd: cost_of(floor),
        };
    }
    OutputRoom::AtMost(fits)
}

/// The price of `model`, `table` consulted first.
fn price_with(table: &PriceTable, model: &str) -> Option<(f64, f64)> {
    table
        .iter()
        .filter(|(prefix, _)| model.starts_with(prefix.as_str()))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, p)| *p)
        .or_else(|| price(model))
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

    #[test]
    fn a_call_is_lowered_to_fit_what_is_left_or_not_made() {
        // claude-sonnet: 3 and 15 micro-USD a token. 10,000 request bytes (and the unseen
        // preamble) cost at most (10,000 + 1,024) * 3 * 1.25 = 41,340 micro-USD of input.
        let table = PriceTable::new();
        let room = |left, asked| output_room(&table, "claude-sonnet-4-5", left, 10_000, asked);
        assert_eq!(room(41_340 + 8192 * 15, Some(8192)), OutputRoom::AsAsked);
        assert_eq!(
            room(41_340 + 8191 * 15, Some(8192)),
            OutputRoom::AtMost(8191)
        );
        assert_eq!(
            room(41_340 + 2000 * 15 + 14, Some(8192)),
            OutputRoom::AtMost(2000)
        );
        assert_eq!(
            room(41_340 + 1023 * 15, Some(8192)),
            OutputRoom::Over {
                worst_case_micro_usd: 41_340 + 1024 * 15
            },
            "fewer than the least a call is made with"
        );
        assert!(matches!(room(40_000, Some(10)), OutputRoom::Over { .. }));
        assert_eq!(room(41_340 + 500 * 15, Some(500)), OutputRoom::AsAsked);
        // No limit asked: counted as the most a model writes, and one is set from what
        // is left when that does not fit.
        assert_eq!(room(41_340 + 3000 * 15, None), OutputRoom::AtMost(3000));
        assert_eq!(room(41_340 + 128_000 * 15, None), OutputRoom::AsAsked);
        assert_eq!(
            room(41_340 + 128_000 * 15 - 1, None),
            OutputRoom::AtMost(127_999)
        );
        // What the lowered call costs at worst is within what was left.
        if let OutputRoom::AtMost(n) = room(1_000_000, Some(1_000_000)) {
            let usage = Usage {
                cache_write_tokens: 11_024,
                output_tokens: u64::from(n),
                ..Usage::default()
            };
            assert!(cost_micro_usd("claude-sonnet-4-5", &usage) <= 1_000_000);
        } else {
            panic!("a million micro-USD leaves room");
        }
        // Free and unpriced models are never held back.
        assert_eq!(
            output_room(&table, "house-model", 0, 10_000, Some(8192)),
            OutputRoom::AsAsked
        );
        let free = PriceTable::from([("m".to_string(), (0.0, 0.0))]);
        assert_eq!(
            output_room(&free, "m", 0, 10_000, Some(8192)),
            OutputRoom::AsAsked
        );
    }
}
