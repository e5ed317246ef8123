//! Spend caps as bounds: a model call is fitted to what is left of its session's cap
//! before it is made, for every agent (the native loop's calls and a wrapped CLI's
//! alike), so the call that would cross a cap is never paid for.

use steadfast_log::money::usd;
use steadfast_log::{Breaker, SessionState};
use steadfast_model::pricing::{output_room, OutputRoom, PriceTable};

/// The output limit a model call of `request_bytes` asking for at most `asked` output
/// tokens (`None`: no limit asked) is made with under the session's spend cap:
/// `Ok(None)` as asked, `Ok(Some(n))` lowered to `n` tokens, or the escalation to
/// record instead of the call when not even a short reply fits.
pub fn fit(
    state: &SessionState,
    prices: &PriceTable,
    request_bytes: usize,
    asked: Option<u32>,
) -> Result<Option<u32>, (Breaker, String)> {
    let (Some(left), Some(cap)) = (state.spend_left(), state.limits.max_cost_micro_usd) else {
        return Ok(None);
    };
    match output_room(prices, &state.model.model, left, request_bytes, asked) {
        OutputRoom::AsAsked => Ok(None),
        OutputRoom::AtMost(n) => Ok(Some(n)),
        OutputRoom::Over {
            worst_case_micro_usd,
        } => Err((
            Breaker::Cost,
            format!(
                "spend cap reached: the next model call could cost up to ${:.4} and ${:.4} of ${:.4} is left",
                usd(worst_case_micro_usd),
                usd(left),
                usd(cap)
            ),
        )),
    }
}
