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
