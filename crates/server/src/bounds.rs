//! The operator's ceilings on sessions' bounds, as the API enforces them: at creation
//! and on every `resume` signal, so no client (anonymous in public mode, or a token's
//! owner) can lift a bound past what the operator set.

use axum::http::StatusCode;
use serde_json::Value;
use steadfast_log::Limits;

use crate::error::ApiError;

/// A 403 naming each of `asked`'s bounds that passes its ceiling (`prefix` is how the
/// request names the bounds' object, e.g. `budget.`), or `None` when all are within.
pub(crate) fn refuse_over(asked: &Limits, ceilings: &Limits, prefix: &str) -> Option<ApiError> {
    let over = asked.over(ceilings);
    if over.is_empty() {
        return None;
    }
    let named: Vec<String> = over
        .iter()
        .map(|(field, asked, ceiling)| {
            format!("{prefix}{field}: {asked} is over this server's ceiling of {ceiling}")
        })
        .collect();
    Some(ApiError::new(
        StatusCode::FORBIDDEN,
        "over_ceiling",
        format!(
            "{}; only the operator can change a ceiling",
            named.join("; ")
        ),
    ))
}

/// A new session's bounds: each one `asked` names, else the operator's default kept
/// within its ceiling, else the ceiling.
pub(crate) fn for_new_session(asked: &Limits, defaults: &Limits, ceilings: &Limits) -> Limits {
    let within = |default: Option<u64>, ceiling: Option<u64>| match (default, ceiling) {
        (Some(d), Some(c)) => Some(d.min(c)),
        (d, c) => d.or(c),
    };
    let defaults = Limits {
        max_cost_micro_usd: within(defaults.max_cost_micro_usd, ceilings.max_cost_micro_usd),
        max_tokens: within(defaults.max_tokens, ceilings.max_tokens),
        max_turns: within(
            defaults.max_turns.map(u64::from),
            ceilings.max_turns.map(u64::from),
        )
        .map(|t| t as u32),
        max_duration_ms: within(defaults.max_duration_ms, ceilings.max_duration_ms),
    };
    defaults.raised(asked)
}

/// Checks a `resume` signal's payload: each bound it sets must be a number within the
/// ceilings.
pub(crate) fn check_resume(payload: &Value, ceilings: &Limits) -> Result<(), ApiError> {
    let (asked, problems) = Limits::from_resume(payload);
    if !problems.is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            problems.join("; "),
        ));
    }
    match refuse_over(&asked, ceilings, "") {
        Some(refusal) => Err(refusal),
        None => Ok(()),
    }
}
