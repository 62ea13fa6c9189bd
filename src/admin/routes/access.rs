//! The guard every request passes (the served names, the origins of requests, the token
//! of reads) and the bearer token that changes need, compared in constant time.

use std::collections::HashMap;

use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{AdminState, ApiError, Shared};
use crate::admin::hosts::ServedHosts;
use crate::config::escape_controls;

/// Answers a request only if its `Host` is served (else 421) and its `Origin`, when sent, is
/// served (else 403), and a read of pool data only with the token when reads need one (else
/// 401, or 403 when the server has none).
pub(super) async fn guard(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let access = &state.access;
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .or_else(|| {
            request
                .uri()
                .authority()
                .map(|authority| authority.as_str())
        });
    if !host.is_some_and(|host| access.hosts.serves(host)) {
        return refuse_host(host, &access.hosts);
    }
    // Browsers send an Origin with every change, and with reads made from another page
    // (their own pages' reads need none): a foreign one is refused whatever the method.
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let served = origin
            .to_str()
            .is_ok_and(|origin| access.hosts.serves_origin(origin));
        if !served {
            return refuse_origin(origin.to_str().unwrap_or("(not text)"), &access.hosts);
        }
    }
    let reads = [Method::GET, Method::HEAD].contains(request.method());
    if reads && access.reads_need_token && request.uri().path().starts_with("/api/") {
        if let Err(error) = state.authorise_read(&request) {
            return error.into_response();
        }
    }
    next.run(request).await
}

/// The 421 of a request addressed to a name the server does not answer.
fn refuse_host(host: Option<&str>, hosts: &ServedHosts) -> Response {
    let asked = host.map_or_else(
        || "a request without a Host header".to_owned(),
        |host| format!("host {}", escape_controls(host)),
    );
    let text = format!(
        "this admin server does not answer {asked}; it answers {}. To serve it under another \
         name, list that name in allowed_hosts of the configuration's admin section \
         (AdminSettings::with_allowed_hosts in code)\n",
        hosts.listed()
    );
    (StatusCode::MISDIRECTED_REQUEST, text).into_response()
}

/// The 403 of a change sent from a page the server did not serve.
fn refuse_origin(origin: &str, hosts: &ServedHosts) -> Response {
    let text = format!(
        "this admin server takes requests only from its own pages, not from origin {}; it \
         serves http:// and https:// under {}. To serve it under another name, list that \
         name in allowed_hosts of the configuration's admin section\n",
        escape_controls(origin),
        hosts.listed()
    );
    (StatusCode::FORBIDDEN, text).into_response()
}

impl AdminState {
    /// Refuses a mutation without the right bearer token.
    pub(in crate::admin) fn authorise(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(token) = &self.access.token else {
            return Err(ApiError(
                StatusCode::FORBIDDEN,
                "this admin server was started without a token, so it changes nothing; \
                 start it with one (AdminSettings::token) and send it as \
                 `Authorization: Bearer <token>`"
                    .into(),
            ));
        };
        match bearer(headers) {
            Some(given) if constant_time_eq(given.as_bytes(), token.expose().as_bytes()) => Ok(()),
            Some(_) => Err(not_the_token()),
            None => Err(ApiError(
                StatusCode::UNAUTHORIZED,
                "this endpoint changes a pool: send `Authorization: Bearer <token>`".into(),
            )),
        }
    }

    /// Refuses a read of pool data without the right token: the bearer, or on the event
    /// stream (which a browser opens without headers) a `token` query parameter.
    fn authorise_read(&self, request: &Request) -> Result<(), ApiError> {
        let Some(token) = &self.access.token else {
            return Err(ApiError(
                StatusCode::FORBIDDEN,
                "this admin server listens off loopback without a token, so it shows no pool \
                 data; start it with one (AdminSettings::token, or token in the \
                 configuration's admin section) and send it as `Authorization: Bearer <token>`"
                    .into(),
            ));
        };
        let in_query = (request.uri().path() == "/api/events")
            .then(|| Query::<HashMap<String, String>>::try_from_uri(request.uri()).ok())
            .flatten()
            .and_then(|Query(mut query)| query.remove("token"));
        let given = bearer(request.headers()).map(str::to_owned).or(in_query);
        match given {
            Some(given) if constant_time_eq(given.as_bytes(), token.expose().as_bytes()) => Ok(()),
            Some(_) => Err(not_the_token()),
            None => Err(ApiError(
                StatusCode::UNAUTHORIZED,
                "this admin server's reads need its token: send `Authorization: Bearer \
                 <token>` (on the event stream, `?token=<token>` also does)"
                    .into(),
            )),
        }
    }
}

/// The bearer token of `Authorization: Bearer <token>`, if sent.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
}

/// The 401 of a token that is not the server's.
fn not_the_token() -> ApiError {
    ApiError(
        StatusCode::UNAUTHORIZED,
        "the bearer token is not this server's".into(),
    )
}

/// Whether `a` and `b` are equal, in time that depends on their lengths only, not on where
/// they differ (a token guessed byte by byte learns nothing from the answer's timing).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut differ = u8::from(a.len() != b.len());
    for (index, byte) in a.iter().enumerate() {
        differ |= byte ^ b.get(index).copied().unwrap_or(!byte);
    }
    differ == 0
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn tokens_compare_by_every_byte_and_the_length() {
        assert!(constant_time_eq(b"s3cret", b"s3cret"));
        assert!(!constant_time_eq(b"s3cret", b"s3creT"));
        assert!(!constant_time_eq(b"s3cret", b"s3cre"));
        assert!(!constant_time_eq(b"s3cre", b"s3cret"));
        assert!(constant_time_eq(b"", b""));
    }
}
