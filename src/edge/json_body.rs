//! A JSON request body, read whatever its `content-type` says: `POST /json` and the admin
//! API take their bodies this way.
//!
//! The label is not checked because the callers that matter do not set it: `curl -d` sends
//! `application/x-www-form-urlencoded`, and HTTP clients send their own default. The body
//! decides: one that is not JSON of the expected shape is refused with serde's reason.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

/// A request body deserialized from JSON, whatever its content type.
pub struct JsonBody<T>(pub T);

/// Why a request has no [`JsonBody`].
#[derive(Debug, thiserror::Error)]
pub enum BadBody {
    /// The body could not be read (over the size limit, or the connection failed); axum's
    /// own answer says which.
    #[error(transparent)]
    Unread(#[from] BytesRejection),
    /// The body is not JSON of the expected shape: serde's reason, and the body for a
    /// handler that explains more.
    #[error("invalid JSON: {error}")]
    Invalid {
        error: serde_json::Error,
        body: Bytes,
    },
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = BadBody;

    async fn from_request(request: Request, state: &S) -> Result<Self, BadBody> {
        let body = Bytes::from_request(request, state).await?;
        serde_json::from_slice(&body)
            .map(JsonBody)
            .map_err(|error| BadBody::Invalid { error, body })
    }
}

impl IntoResponse for BadBody {
    /// Axum's answer for a body not read; 400 with `{"error": …}` for one not JSON.
    fn into_response(self) -> Response {
        match self {
            BadBody::Unread(rejection) => match cut_to_make_room(&rejection) {
                // Cut while it waited for the rest of its body (`grpc_body.rs`): may retry.
                Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
                None => rejection.into_response(),
            },
            invalid @ BadBody::Invalid { .. } => {
                let body = serde_json::json!({ "error": invalid.to_string() });
                (StatusCode::BAD_REQUEST, Json(body)).into_response()
            }
        }
    }
}

/// The reason, when the body was not read because its request was cut to make room for
/// others (`grpc_body.rs`).
fn cut_to_make_room(rejection: &BytesRejection) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(rejection);
    while let Some(error) = source {
        if let Some(status) = error.downcast_ref::<tonic::Status>()
            && super::grpc_body::is_cut(status)
        {
            return Some(format!("{}\n", status.message()));
        }
        source = error.source();
    }
    None
}
