//! API errors: a status and a JSON body `{"error": {"code", "message"}}`. Details of
//! internal failures go to the log, not to the client.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// An error answered to a client.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable machine-readable code.
    pub code: &'static str,
    /// What went wrong, for humans.
    pub message: String,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    /// 429 `rate_limited`: the caller is to slow down (counted in `/metrics`).
    pub fn rate_limited(message: String) -> Self {
        steadfast_metrics::metrics().http_refused("rate_limited");
        Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", message)
    }

    /// 404 for a session that does not exist or belongs to someone else (the two
    /// are indistinguishable on purpose).
    pub fn no_session(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "session_not_found",
            format!("no session {id}"),
        )
    }

    /// 500, with the detail logged only.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(error = %detail, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; see the server log",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(crate::wire::Error {
            error: crate::wire::ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
            },
        });
        (self.status, body).into_response()
    }
}

impl From<steadfast_world::Error> for ApiError {
    fn from(e: steadfast_world::Error) -> Self {
        use steadfast_world::Error as E;
        match e {
            E::NotFound(id) => ApiError::no_session(&id),
            E::Invalid(m) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", m),
            E::Ended(id) => ApiError::new(
                StatusCode::CONFLICT,
                "session_ended",
                format!("session {id} has ended"),
            ),
            E::LeaseHeld { session, .. } => ApiError::new(
                StatusCode::CONFLICT,
                "session_busy",
                format!("session {session} is being driven; try again when its turn is over"),
            ),
            E::Corrupt { .. } => {
                tracing::error!(error = %e, "stored data is damaged");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "data_corrupt",
                    e.to_string(),
                )
            }
            // The store's own damage names its files and tables: the server's log says
            // which, the client hears only that it is damaged.
            E::CorruptStore { .. } => {
                tracing::error!(error = %e, "the world's store is damaged");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "data_corrupt",
                    "the server's store is damaged; see the server log",
                )
            }
            E::Backend { .. } | E::Blob { .. } => {
                let e = ApiError::internal(e);
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e.message)
            }
            other => ApiError::internal(other),
        }
    }
}

impl From<steadfast_harness::Error> for ApiError {
    fn from(e: steadfast_harness::Error) -> Self {
        match e {
            steadfast_harness::Error::World(w) => w.into(),
            steadfast_harness::Error::Invalid(m) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", m)
            }
            steadfast_harness::Error::NoFile(m) => {
                ApiError::new(StatusCode::NOT_FOUND, "no_file", m)
            }
            steadfast_harness::Error::DataLost(m) => {
                tracing::error!(error = %m, "stored data is lost");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "data_lost", m)
            }
            steadfast_harness::Error::NotWaiting(m) => {
                ApiError::new(StatusCode::CONFLICT, "not_waiting", m)
            }
            steadfast_harness::Error::NotHere(m) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_here", m)
            }
            steadfast_harness::Error::Busy(m) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "session_busy", m)
            }
            other => ApiError::internal(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_store_is_named_to_the_client_without_its_paths() {
        let damaged = steadfast_world::Error::corrupt_store("/srv/steadfast/world.db is empty");
        let answered = ApiError::from(damaged);
        assert_eq!(answered.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(answered.code, "data_corrupt");
        assert!(!answered.message.contains("/srv"), "{}", answered.message);
    }

    #[tokio::test]
    async fn a_failed_task_is_the_servers_fault_not_the_callers() {
        let panicked = tokio::spawn(async { panic!("a bug") }).await.unwrap_err();
        let answered = ApiError::from(steadfast_harness::Error::from(panicked));
        assert_eq!(answered.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(answered.code, "internal");
        assert!(!answered.message.contains("a bug"), "{}", answered.message);
    }
}
