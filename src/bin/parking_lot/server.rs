//! The admin server the command line talks to: its address as the user gives it, and the
//! requests it sends (reads, and changes with the token) with their answers or errors.

use serde_json::Value;

use super::Failure;

/// The admin server's address as `given` (by `source`, `--url` or `PARKING_LOT_URL`) names
/// it, without a trailing `/`: `http://` is assumed where no scheme is written
/// (`127.0.0.1:7480`); any scheme but `http` and `https`, and what is no address, are
/// refused saying so.
pub(crate) fn server_url(given: &str, source: &str) -> Result<String, Failure> {
    let trimmed = given.trim().trim_end_matches('/');
    let url = if trimmed.contains("://") {
        trimmed.to_owned()
    } else {
        format!("http://{trimmed}")
    };
    let parsed = reqwest::Url::parse(&url).map_err(|error| {
        Failure(format!(
            "{source} {given:?} is not an address ({error}); write it as \
             http://127.0.0.1:7480 or 127.0.0.1:7480"
        ))
    })?;
    if !["http", "https"].contains(&parsed.scheme()) {
        return Err(Failure(format!(
            "{source} {given:?} has the scheme {}; the admin server speaks http:// or https://",
            parsed.scheme()
        )));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(Failure(format!(
            "{source} {given:?} names no host; write it as http://127.0.0.1:7480"
        )));
    }
    Ok(url)
}

/// A pool name as a path segment: the characters a name may hold pass, others are escaped.
pub(crate) fn path(name: &str) -> String {
    name.bytes()
        .map(|byte| match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                char::from(byte).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// The admin server, and how to reach it.
pub(crate) struct Server {
    pub(crate) url: String,
    pub(crate) token: Option<String>,
    pub(crate) client: reqwest::Client,
}

impl Server {
    /// Reads `path`, with the token when one is given (reads need it off loopback).
    pub(crate) async fn get(&self, path: &str) -> Result<Value, Failure> {
        let mut request = self.client.get(format!("{}{path}", self.url));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        self.answer(request).await
    }

    /// Asks pool `pool` to do `action`, with the token.
    pub(crate) async fn act(
        &self,
        pool: &str,
        action: &str,
        body: Option<Value>,
    ) -> Result<Value, Failure> {
        let Some(token) = &self.token else {
            return Err(Failure(format!(
                "{action} changes the pool: give the admin server's token with --token or \
                 PARKING_LOT_TOKEN"
            )));
        };
        let mut request = self
            .client
            .post(format!("{}/api/pools/{}/{action}", self.url, path(pool)))
            .bearer_auth(token);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        self.answer(request).await
    }

    /// The JSON of a successful answer, or the server's error text.
    pub(crate) async fn answer(&self, request: reqwest::RequestBuilder) -> Result<Value, Failure> {
        let response = request.send().await.map_err(|error| {
            Failure(format!(
                "no admin server answers at {} ({}); start one (see \
                 docs/guide/operating.md, \"The dashboard\") or give its address with --url",
                self.url,
                error.without_url()
            ))
        })?;
        let status = response.status();
        let text = response.text().await.map_err(|error| {
            Failure(format!(
                "the answer could not be read: {}",
                error.without_url()
            ))
        })?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status.is_success() {
            return Ok(value);
        }
        let reason = value["error"]
            .as_str()
            .map_or_else(|| value.to_string(), str::to_owned);
        // Printed escaped, like everything a server sends (see `main`).
        Err(Failure(format!("{} ({status})", reason)))
    }
}
