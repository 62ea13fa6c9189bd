//! Talking to an admin server from a test thread: one request with a bearer token, answered
//! as its status and JSON, and polling until a check answers.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use serde_json::Value;

/// Polls `check` every 50 ms until it answers, for at most 30 s (then fails naming `what`).
pub fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(Instant::now() < deadline, "not within 30 s: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An admin server's answer to `method` on `url` with `token` (and a JSON `body`, if any):
/// its status, and its JSON (or its text as a JSON string).
pub fn call_with(
    token: &str,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut request = reqwest::Client::new()
            .request(method, url)
            .bearer_auth(token);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.expect("the admin server answers");
        let status = response.status().as_u16();
        let text = response.text().await.expect("an answer");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    })
}
