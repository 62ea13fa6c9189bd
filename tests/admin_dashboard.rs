//! The admin dashboard (`GET /`, cargo feature `admin`) in a real browser: headless Chromium
//! driven over WebDriver by chromedriver. The page shows the pool `?pool=` names (the
//! first by default) and its numbers as the pool reports them, follows them live without a
//! reload, lists a parked task with why it waits and when it should start (50 a page),
//! shows the server's error text when an action fails, and its buttons pause, resume and
//! cancel for real.
//!
//! It needs `/usr/bin/chromedriver` and Chromium (the Debian packages `chromium` and
//! `chromium-driver`; `scripts/test.sh` installs them). Without them the test says so and
//! passes, unless `PL_REQUIRE_BROWSER=1` (as in `scripts/test.sh`) makes that a failure.
//!
//! With `PL_DASHBOARD_SCREENSHOT=<path>` it also puts the pool under load for about 20
//! seconds and writes a PNG of the dashboard (1280x900) there: `docs/dashboard.png` is one.
//!
//! The WebDriver calls are plain JSON over HTTP, made with `reqwest` (which the `admin`
//! feature has already): the dozen commands used here did not justify a WebDriver client
//! crate (fantoccini brings hyper, cookie, time, url and Mozilla's `webdriver` crate with
//! ICU segmentation data, about 40 crates, and an MPL-licensed one).
#![cfg(unix)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_parking_lot::admin::{Admin, AdminServer, AdminSettings};
use prometheus_parking_lot::config::Secret;
use prometheus_parking_lot::core::{
    Budget, Capacity, FairByUse, PoolStats, TenantWeights, UsageCharge,
};
use prometheus_parking_lot::core::{SubmitOptions, TaskMetadata, WorkerExecutor, WorkerPool};
use prometheus_parking_lot::schedule::{Schedule, Timing};
use prometheus_parking_lot::{MailboxKey, Priority, ResourceCost, ResourceKind, WorkerPoolConfig};
use serde_json::{json, Value};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";
const TOKEN: &str = "dashboard-test-token";
/// How long any one thing may take to show.
const PATIENCE: Duration = Duration::from_secs(20);
/// GPU memory of the pool, GiB.
const VRAM: u32 = 80;

// ------------------------------------------------------------------------------ the pool

/// Runs a task by its payload: `hold` waits until the gate opens, `ms:N` sleeps N ms,
/// anything else returns at once.
#[derive(Clone)]
struct Work(Arc<AtomicBool>);

#[async_trait::async_trait]
impl WorkerExecutor<String, String> for Work {
    async fn execute(&self, payload: String, _meta: TaskMetadata) -> String {
        if payload == "hold" {
            while !self.0.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        } else if let Some(ms) = payload.strip_prefix("ms:") {
            let ms = ms.parse().expect("a number of ms");
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        payload
    }
}

type Pool = WorkerPool<String, String, Work>;

fn task(id: u64, tenant: &str, vram: u32) -> TaskMetadata {
    TaskMetadata::new(id, ResourceCost::gpu_vram(vram)).with_mailbox(MailboxKey::new(tenant))
}

/// Waits until `done(stats)` holds, or fails saying what did not happen.
async fn until_stats(pool: &Pool, what: &str, done: impl Fn(&PoolStats) -> bool) -> PoolStats {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let stats = pool.stats();
        if done(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "{what}: not in time; {stats:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// -------------------------------------------------------------------------- chromedriver

/// A chromedriver child process in a process group of its own: dropping it kills the
/// group, so the browsers it started go too, however the test ends.
struct Chromedriver {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Chromedriver {
    /// Starts chromedriver on a free port and waits until it is ready; `None` (after a
    /// notice) when it is not installed and the environment does not require it.
    async fn start_or_skip() -> Option<Self> {
        if !Path::new(CHROMEDRIVER).exists() {
            let advice = format!(
                "{CHROMEDRIVER} is missing: install the Debian packages chromium and chromium-driver \
                 (apt-get install -y --no-install-recommends chromium chromium-driver)"
            );
            assert!(
                std::env::var("PL_REQUIRE_BROWSER").as_deref() != Ok("1"),
                "PL_REQUIRE_BROWSER=1 and {advice}"
            );
            eprintln!("SKIPPED the dashboard's browser test: {advice}; set PL_REQUIRE_BROWSER=1 to make this a failure");
            return None;
        }
        // A free port: bound, read, and let go just before chromedriver takes it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let log =
            std::env::temp_dir().join(format!("chromedriver-{}-{port}.log", std::process::id()));
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("chromedriver starts");
        let mut driver = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
        };
        let http = reqwest::Client::new();
        let deadline = Instant::now() + PATIENCE;
        loop {
            let ready = match http.get(format!("{}/status", driver.url)).send().await {
                Ok(response) => json_of(response)
                    .await
                    .is_some_and(|status| status["value"]["ready"] == true),
                Err(_) => false,
            };
            if ready {
                return Some(driver);
            }
            if let Ok(Some(exit)) = driver.child.try_wait() {
                panic!("chromedriver exited ({exit}): {}", driver.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver is not ready in time: {}",
                driver.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_else(|error| format!("(no log: {error})"))
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        // The whole group: chromedriver and the Chromium processes it started.
        let group = -(self.child.id() as libc::pid_t);
        // SAFETY: kill(2) with a process group id we created; it touches no memory.
        unsafe { libc::kill(group, libc::SIGKILL) };
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The body of a response as JSON, if it is JSON.
async fn json_of(response: reqwest::Response) -> Option<Value> {
    serde_json::from_str(&response.text().await.ok()?).ok()
}

// ------------------------------------------------------------------------------ browser

/// The key under which WebDriver names an element.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A WebDriver session: a headless Chromium window.
struct Browser {
    http: reqwest::Client,
    /// `http://127.0.0.1:PORT/session/ID`
    session: String,
}

impl Browser {
    async fn open(driver: &Chromedriver) -> Self {
        let http = reqwest::Client::new();
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            // Prompts (confirm) stay open until the test answers them.
            "unhandledPromptBehavior": "ignore",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,900", "--hide-scrollbars", "--lang=en-US"],
            },
        }}});
        let response = http
            .post(format!("{}/session", driver.url))
            .body(capabilities.to_string())
            .header("content-type", "application/json")
            .send()
            .await
            .expect("chromedriver answers");
        let answer = json_of(response).await.unwrap_or(Value::Null);
        let Some(id) = answer["value"]["sessionId"].as_str() else {
            panic!(
                "no browser session: {answer}; chromedriver's log: {}",
                driver.log_text()
            );
        };
        let browser = Self {
            http,
            session: format!("{}/session/{id}", driver.url),
        };
        browser.fit_viewport(1280, 900).await;
        browser
    }

    /// Sizes the window so that the page (what a screenshot shows) is `width` x `height`:
    /// the window's own frame comes on top.
    async fn fit_viewport(&self, width: i64, height: i64) {
        let frame = self
            .script(
                "return [window.outerWidth - window.innerWidth, window.outerHeight - window.innerHeight];",
                json!([]),
            )
            .await
            .expect("the window's frame");
        let (extra_width, extra_height) = (
            frame[0].as_i64().unwrap_or(0),
            frame[1].as_i64().unwrap_or(0),
        );
        self.post(
            "/window/rect",
            json!({ "width": width + extra_width, "height": height + extra_height }),
        )
        .await
        .expect("the window takes its size");
    }

    /// A WebDriver command: its `value`, or the driver's error and message.
    async fn command(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
        let mut request = self.http.request(method, format!("{}{path}", self.session));
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.map_err(|error| error.to_string())?;
        let ok = response.status().is_success();
        let answer = json_of(response).await.unwrap_or(Value::Null);
        let value = answer["value"].clone();
        if ok {
            Ok(value)
        } else {
            Err(format!("{}: {}", value["error"], value["message"]))
        }
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value, String> {
        self.command(reqwest::Method::POST, path, Some(body)).await
    }

    async fn goto(&self, url: &str) {
        self.post("/url", json!({ "url": url }))
            .await
            .expect("the page loads");
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page.
    async fn script(&self, script: &str, args: Value) -> Result<Value, String> {
        self.post("/execute/sync", json!({ "script": script, "args": args }))
            .await
    }

    /// The text of the element `css` selects (`None` while there is none).
    async fn text(&self, css: &str) -> Option<String> {
        let value = self
            .script(
                "const node = document.querySelector(arguments[0]); return node && node.textContent;",
                json!([css]),
            )
            .await
            .ok()?;
        value.as_str().map(str::to_owned)
    }

    /// Waits until the text of `css` satisfies `good`; fails with the last text seen.
    async fn until_text(&self, css: &str, what: &str, good: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let text = self.text(css).await;
            if let Some(text) = text.as_deref().filter(|text| good(text)) {
                return text.to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "the page does not show {what} in time: {css} reads {text:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the number `css` shows (thousands separators aside) is `expected`.
    async fn until_number(&self, css: &str, expected: u64) {
        self.until_text(css, &format!("{expected}"), |text| {
            text.replace(',', "").trim() == expected.to_string()
        })
        .await;
    }

    /// Waits until `script` returns `expected`; fails with the last answer.
    async fn until_script(&self, script: &str, expected: Value, what: &str) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let answer = self.script(script, json!([])).await;
            if answer.as_ref() == Ok(&expected) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the page does not show {what} in time: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The element `css` selects, once it is there and enabled.
    async fn enabled(&self, css: &str) -> String {
        let script = "const node = document.querySelector(arguments[0]); \
                      return node && !node.disabled ? node : null;";
        self.element_by_script(script, json!([css]), css).await
    }

    /// Waits until `script` returns an element, and names it.
    async fn element_by_script(&self, script: &str, args: Value, what: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let found = self.script(script, args.clone()).await;
            if let Some(id) = found
                .as_ref()
                .ok()
                .and_then(|value| value[ELEMENT].as_str())
            {
                return id.to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "no usable {what} in time: {found:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Clicks an element as a user does (WebDriver's click: scrolled to, hit-tested).
    async fn click_element(&self, element: &str) {
        self.post(&format!("/element/{element}/click"), json!({}))
            .await
            .expect("the click lands");
    }

    async fn click(&self, css: &str) {
        let element = self.enabled(css).await;
        self.click_element(&element).await;
    }

    /// Replaces what the input `css` holds by typing `text`.
    async fn type_into(&self, css: &str, text: &str) {
        let element = self.enabled(css).await;
        self.post(&format!("/element/{element}/clear"), json!({}))
            .await
            .expect("the input clears");
        self.post(
            &format!("/element/{element}/value"),
            json!({ "text": text }),
        )
        .await
        .expect("the keys are typed");
    }

    /// Waits for a prompt (`confirm()`), returns its text and accepts it.
    async fn accept_prompt(&self) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self
                .command(reqwest::Method::GET, "/alert/text", None)
                .await
            {
                Ok(text) => {
                    self.post("/alert/accept", json!({}))
                        .await
                        .expect("the prompt is accepted");
                    return text.as_str().unwrap_or_default().to_owned();
                }
                Err(error) => assert!(Instant::now() < deadline, "no prompt in time: {error}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The page as a PNG.
    async fn screenshot(&self) -> Vec<u8> {
        let shot = self
            .command(reqwest::Method::GET, "/screenshot", None)
            .await
            .expect("a screenshot");
        base64_decode(shot.as_str().expect("base64 text"))
    }

    async fn quit(self) {
        let _ = self.command(reqwest::Method::DELETE, "", None).await;
    }
}

/// Standard base64 (WebDriver's screenshots), without a crate for 20 lines.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |byte: u8| -> u32 {
        match byte {
            b'A'..=b'Z' => u32::from(byte - b'A'),
            b'a'..=b'z' => u32::from(byte - b'a') + 26,
            b'0'..=b'9' => u32::from(byte - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            other => panic!("not base64: {other:?}"),
        }
    };
    let digits: Vec<u8> = text
        .bytes()
        .filter(|byte| !byte.is_ascii_whitespace() && *byte != b'=')
        .collect();
    let mut bytes = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let bits = chunk
            .iter()
            .fold(0u32, |bits, &digit| (bits << 6) | value(digit))
            << (6 * (4 - chunk.len()));
        let [_, a, b, c] = bits.to_be_bytes();
        bytes.extend_from_slice(&[a, b, c][..chunk.len() - 1]);
    }
    bytes
}

// --------------------------------------------------------------------------------- test

/// The pool under test: GPU memory and CPU slots, a provider's rate limit (I/O units,
/// 4 a second), and tenants ordered by their weighted use (acme weighs 3).
fn llm_config() -> WorkerPoolConfig {
    WorkerPoolConfig::new()
        .with_fair_share_by_use(
            FairByUse::new(UsageCharge::Held),
            TenantWeights::default().with("acme", 3),
        )
        .with_worker_count(8)
        .with_capacity(
            Capacity::default()
                .with(ResourceKind::GpuVram, VRAM)
                .with(ResourceKind::Cpu, 8),
        )
        .with_budget(
            ResourceKind::Io,
            Budget::new(4, Duration::from_secs(1)).with_burst(12),
        )
}

/// Serves `llm` (the pool under test; the first by name) and `vision`.
fn serve(llm: &Pool, vision: &Pool) -> AdminServer {
    Admin::new(AdminSettings {
        bind: "127.0.0.1:0".parse().unwrap(),
        token: Some(Secret::new(TOKEN)),
        ..AdminSettings::default()
    })
    .with_pool("llm", llm.client().clone())
    .with_pool("vision", vision.client().clone())
    .serve()
    .expect("the admin server starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_follows_a_live_pool_and_controls_it() {
    let Some(driver) = Chromedriver::start_or_skip().await else {
        return;
    };
    let gate = Arc::new(AtomicBool::new(false));
    let pool = WorkerPool::new(llm_config(), Work(gate.clone())).expect("the pool starts");
    for id in 1..=3 {
        pool.submit_async("quick".into(), task(id, "acme", 1))
            .await
            .expect("admitted");
    }
    until_stats(&pool, "three tasks complete", |s| s.completed_tasks == 3).await;
    let vision = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(1)
            .with_max_units(4),
        Work(gate.clone()),
    )
    .expect("the second pool starts");
    let server = serve(&pool, &vision);
    let browser = Browser::open(&driver).await;

    // `?pool=` picks a pool; the selector switches to another, without a reload.
    browser.goto(&format!("{}?pool=vision", server.url())).await;
    browser
        .until_text("#pool-select", "the pools", |text| text == "llmvision")
        .await;
    let chosen = "return [document.getElementById('pool-select').value, location.search];";
    browser
        .until_script(chosen, json!(["vision", "?pool=vision"]), "the chosen pool")
        .await;
    browser.until_number("#submitted", 0).await;
    let llm = browser
        .element_by_script(
            "return document.querySelector('#pool-select option[value=\"llm\"]');",
            json!([]),
            "the llm option",
        )
        .await;
    browser.click_element(&llm).await;
    browser.until_number("#submitted", 3).await;
    browser
        .until_script(
            chosen,
            json!(["llm", "?pool=llm"]),
            "the address follows the choice",
        )
        .await;
    // Without `?pool=`, the first pool by name.
    browser.goto(&server.url()).await;
    browser
        .until_script(
            chosen,
            json!(["llm", "?pool=llm"]),
            "the first pool is shown",
        )
        .await;

    // The page shows the pool, its state and its numbers as the pool reports them.
    browser
        .until_text("#pool-state", "the state", |text| text == "running")
        .await;
    let stats = pool.stats();
    browser
        .until_number("#completed", stats.completed_tasks)
        .await;
    browser
        .until_number("#submitted", stats.submitted_tasks)
        .await;
    browser.until_number("#running-count", 0).await;
    browser.until_number("#parked-count", 0).await;
    let charts = browser
        .script(
            "return document.querySelectorAll('#chart-throughput canvas, #chart-wait canvas').length;",
            json!([]),
        )
        .await;
    assert_eq!(charts, Ok(json!(2)), "both charts are drawn");

    // More tasks run: the numbers follow, without a reload.
    for id in 4..=5 {
        pool.submit_async("quick".into(), task(id, "acme", 1))
            .await
            .expect("admitted");
    }
    let stats = until_stats(&pool, "five tasks complete", |s| s.completed_tasks == 5).await;
    browser
        .until_number("#completed", stats.completed_tasks)
        .await;
    browser
        .until_number("#submitted", stats.submitted_tasks)
        .await;

    // A task that does not fit parks, and the page says why; a tenant's name is text.
    pool.submit_async(
        "hold".into(),
        task(10, "acme", VRAM - 4).with_mailbox(MailboxKey::new("acme").with_session("chat-1")),
    )
    .await
    .expect("runs");
    let odd_tenant = "<b>globex</b>";
    pool.submit_async(
        "quick".into(),
        task(11, odd_tenant, 8).with_priority(Priority::High),
    )
    .await
    .expect("parks");
    until_stats(&pool, "one running, one parked", |s| {
        s.active_tasks == 1 && s.queued_tasks == 1
    })
    .await;
    browser.until_number("#parked-count", 1).await;
    browser.until_number("#running-count", 1).await;
    // Its place in line and expected start: task 10 has no timeout and is the first run
    // of its size, so it is expected to run as long again as it has run so far.
    let parked = browser
        .until_text(
            "#parked-list",
            "the parked task, its reason and estimate",
            |text| {
                text.contains("needs 8 GPU VRAM, 4 free")
                    && text.contains("1st in line, expected in ~")
            },
        )
        .await;
    assert!(
        parked.contains("11") && parked.contains(odd_tenant),
        "{parked}"
    );
    let markup = browser
        .script(
            "return document.querySelectorAll('#parked-list b, #tenants-list b').length;",
            json!([]),
        )
        .await;
    assert_eq!(
        markup,
        Ok(json!(0)),
        "a tenant's name is shown as text, not markup"
    );
    let running = browser
        .until_text("#running-list", "the running task", |text| {
            text.contains("10") && text.contains("session chat-1")
        })
        .await;
    assert!(running.contains("76 GPU VRAM"), "{running}");
    let tenants = browser
        .until_text("#tenants-list", "both tenants", |text| {
            text.contains("acme") && text.contains(odd_tenant) && text.contains("76 GPU VRAM")
        })
        .await;
    // Each tenant's weight, and its weighted service under the fair share by use.
    let weights = browser
        .script(
            "return [...document.querySelectorAll('#tenants-list tr')].map(row => \
             [row.cells[0].textContent, row.cells[4].textContent, row.cells[5].textContent]);",
            json!([]),
        )
        .await
        .expect("the tenants' rows");
    let rows = weights.as_array().expect("rows");
    let acme = rows
        .iter()
        .find(|row| row[0] == "acme")
        .unwrap_or_else(|| panic!("acme's row: {tenants}"));
    assert_eq!(acme[1], "3", "acme's weight: {weights}");
    assert!(
        acme[2]
            .as_str()
            .is_some_and(|service| service != "–" && !service.is_empty()),
        "acme's service: {weights}"
    );
    let other = rows
        .iter()
        .find(|row| row[0] != "acme")
        .unwrap_or_else(|| panic!("the other tenant's row: {tenants}"));
    assert_eq!(other[1], "1", "the default weight: {weights}");

    // An action with a wrong token fails with the server's words, and changes nothing.
    browser.type_into("#token", "not-the-token").await;
    browser.click("#pause").await;
    browser
        .until_text("#error", "the server's error", |text| {
            text.contains("the bearer token is not this server's")
        })
        .await;
    assert!(!pool.stats().paused, "nothing changed");

    // With the token, Cancel (confirmed) cancels the parked task.
    browser.type_into("#token", TOKEN).await;
    let stored = browser
        .script(
            "return sessionStorage.getItem('parking-lot-admin-token');",
            json!([]),
        )
        .await;
    assert_eq!(
        stored,
        Ok(json!(TOKEN)),
        "the token is kept for the session"
    );
    let cancel = browser
        .element_by_script(
            "const row = [...document.querySelectorAll('#parked-list tr')]
                 .find((tr) => tr.children[1].textContent === arguments[0]);
             return row ? row.querySelector('button') : null;",
            json!(["11"]),
            "Cancel button of task 11",
        )
        .await;
    browser.click_element(&cancel).await;
    let question = browser.accept_prompt().await;
    assert!(question.contains("Cancel task 11"), "{question}");
    until_stats(&pool, "the parked task is cancelled", |s| {
        s.cancelled_tasks == 1 && s.queued_tasks == 0
    })
    .await;
    browser.until_number("#parked-count", 0).await;
    browser
        .until_text(
            "#error",
            "no error after an action that worked",
            str::is_empty,
        )
        .await;

    // Pause from the page: a task submitted then parks and stays parked until Resume.
    gate.store(true, Ordering::Release);
    until_stats(&pool, "the held task ends", |s| s.active_tasks == 0).await;
    browser.click("#pause").await;
    until_stats(&pool, "the pool pauses", |s| s.paused).await;
    browser
        .until_text("#pool-state", "the paused state", |text| text == "paused")
        .await;
    pool.submit_async("quick".into(), task(20, "acme", 1))
        .await
        .expect("admitted while paused");
    let before = until_stats(&pool, "the task parks", |s| s.queued_tasks == 1).await;
    browser
        .until_text("#parked-list", "the pause as the reason", |text| {
            text.contains("the pool is paused")
        })
        .await;
    // It does not start: watched for a while (the deadline is the point here).
    let watch_until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < watch_until {
        let stats = pool.stats();
        assert_eq!(
            (
                stats.active_tasks,
                stats.queued_tasks,
                stats.completed_tasks
            ),
            (0, 1, before.completed_tasks),
            "nothing starts while paused"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Parked tasks come 50 a page, in rank order.
    for id in 21..=74 {
        pool.submit_async("quick".into(), task(id, "acme", 1))
            .await
            .expect("admitted while paused");
    }
    until_stats(&pool, "55 tasks park", |s| s.queued_tasks == 55).await;
    browser
        .until_text("#parked-range", "the first page", |text| {
            text == "1–50 of 55"
        })
        .await;
    browser.click("#parked-next").await;
    browser
        .until_text("#parked-range", "the second page", |text| {
            text == "51–55 of 55"
        })
        .await;
    let ranks = browser
        .script(
            "return [...document.querySelectorAll('#parked-list tr')].map((tr) => tr.children[0].textContent);",
            json!([]),
        )
        .await;
    assert_eq!(ranks, Ok(json!(["51", "52", "53", "54", "55"])));

    // Resume from the page: they all run, and the page that emptied shows nothing parked.
    browser.click("#resume").await;
    let stats = until_stats(&pool, "the parked tasks run after Resume", |s| {
        !s.paused && s.completed_tasks == before.completed_tasks + 55
    })
    .await;
    browser
        .until_text("#pool-state", "the running state", |text| text == "running")
        .await;
    browser
        .until_number("#completed", stats.completed_tasks)
        .await;
    browser.until_number("#parked-count", 0).await;
    browser
        .until_text("#parked-list", "an empty parked list", str::is_empty)
        .await;

    // A schedule shows in its panel (one that ticks on January 1st only, so no task of it
    // runs here), and its button pauses it.
    let new_year = Timing::cron("0 0 1 1 *", "Europe/Paris").expect("a valid expression");
    let new_year = Schedule::new("new-year", new_year).expect("a valid name");
    pool.add_schedule(new_year, |_| "greet".into())
        .expect("the schedule is added");
    browser
        .until_text("#schedules-list", "the schedule", |text| {
            text.contains("new-year") && text.contains("0 0 1 1 * (Europe/Paris)")
        })
        .await;
    browser.click("#schedules-list button").await;
    let deadline = Instant::now() + PATIENCE;
    while !pool.schedules()[0].paused {
        assert!(
            Instant::now() < deadline,
            "the page's button paused the schedule"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    browser
        .until_text("#schedules-list", "the paused schedule", |text| {
            text.contains("paused") && text.contains("Resume")
        })
        .await;

    if let Some(path) = std::env::var_os("PL_DASHBOARD_SCREENSHOT") {
        screenshot_under_load(&browser, &vision, Path::new(&path)).await;
    }
    browser.quit().await;
}

/// Puts a fresh pool (like the one under test, so the charts hold this load only) under
/// load for about 20 seconds (tenants of all sizes, more work than fits, a few refusals and
/// timeouts) and writes a screenshot of its dashboard to `path`.
async fn screenshot_under_load(browser: &Browser, vision: &Pool, path: &Path) {
    let pool = WorkerPool::new(llm_config(), Work(Arc::new(AtomicBool::new(true))))
        .expect("the pool starts");
    let server = serve(&pool, vision);
    browser.goto(&server.url()).await;
    browser
        .until_text("#live", "a live connection", |text| text == "live")
        .await;
    let tenants = ["acme", "globex", "initech", "umbrella", "hooli"];
    let costs = [4, 8, 8, 12, 16, 24];
    let priorities = [
        Priority::Normal,
        Priority::Normal,
        Priority::High,
        Priority::Low,
    ];
    // A small linear congruential generator: varied, and the same each run.
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |below: usize| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) as usize % below
    };
    // More work comes than fits (about 7 tasks a second for 3 to 4 that end), so work
    // parks and the page has something to show; the screenshot is taken as it comes.
    let started = Instant::now();
    let mut id = 1_000;
    while started.elapsed() < Duration::from_secs(20) {
        id += 1;
        let tenant = tenants[next(tenants.len())];
        let key = MailboxKey::new(tenant).with_user(format!("user-{}", next(40)));
        let cost = if next(5) == 0 {
            ResourceCost::cpu(1 + next(3) as u32)
        } else if next(6) == 0 {
            ResourceCost::io(3 + next(4) as u32)
        } else {
            ResourceCost::gpu_vram(costs[next(costs.len())])
        };
        let mut meta = TaskMetadata::new(id, cost)
            .with_mailbox(key)
            .with_priority(priorities[next(priorities.len())]);
        let mut options = SubmitOptions::default();
        if id % 23 == 0 {
            // Too large for the pool: refused.
            meta.cost = ResourceCost::gpu_vram(VRAM + 40);
        } else if id % 17 == 0 {
            // Runs past its timeout: ends without completing.
            options.timeout = Some(Duration::from_millis(300));
        }
        let payload = format!("ms:{}", 600 + next(2_600));
        let _ = pool.submit_with(payload, meta, options).await;
        tokio::time::sleep(Duration::from_millis(100 + next(100) as u64)).await;
    }
    let stats = pool.stats();
    assert!(stats.active_tasks > 0, "under load: {stats:?}");
    let png = browser.screenshot().await;
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).expect("the screenshot's folder");
    }
    std::fs::write(path, png).expect("the screenshot is written");
    eprintln!("the dashboard under load: {}", path.display());
}

/// What an operator saw on first use (issue 41), mended: the page shows the pool as it
/// loads (numbers, bars, lists and charts, before any request of its own); a capacity set
/// by one number for all kinds has a bar for the kind tasks use only; tasks without a
/// mailbox are one tenant row; the chart's "started" line shows where "ended" lies on it;
/// and every read of the page shows one instant (the running count, the running list and
/// the capacity bar agree) while tasks start and end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_one_instant_of_the_pool_as_it_loads() {
    let Some(driver) = Chromedriver::start_or_skip().await else {
        return;
    };
    let gate = Arc::new(AtomicBool::new(false));
    let pool = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(4)
            .with_max_units(24),
        Work(gate.clone()),
    )
    .expect("the pool starts");
    // Served before the tasks run, so that its history (the charts) holds them.
    let server = Admin::new(AdminSettings {
        bind: "127.0.0.1:0".parse().unwrap(),
        ..AdminSettings::default()
    })
    .with_pool("llm", pool.client().clone())
    .serve()
    .expect("the admin server starts");
    let anonymous = |id, vram| TaskMetadata::new(id, ResourceCost::gpu_vram(vram));
    for id in 1..=6 {
        pool.submit_async("quick".into(), anonymous(id, 1))
            .await
            .expect("admitted");
    }
    until_stats(&pool, "six tasks complete", |s| s.completed_tasks == 6).await;
    pool.submit_async("hold".into(), task(10, "acme", 8))
        .await
        .expect("runs");
    for id in 11..=13 {
        pool.submit_async("hold".into(), anonymous(id, 20))
            .await
            .expect("parks");
    }
    until_stats(&pool, "one running, three parked", |s| {
        s.active_tasks == 1 && s.queued_tasks == 3
    })
    .await;
    // The charts draw whole seconds: the one the tasks ended in is over.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let browser = Browser::open(&driver).await;

    // Read once, as soon as the page has loaded: no waiting for the stream or a fetch.
    browser.goto(&server.url()).await;
    let shown = browser
        .script(
            "const text = (id) => document.getElementById(id).textContent;
             const rows = (id) => [...document.querySelectorAll(`#${id} tr`)]
                 .map((tr) => [...tr.children].map((td) => td.textContent));
             return {
               running: text('running-count'),
               parked: text('parked-count'),
               completed: text('completed'),
               bars: [...document.querySelectorAll('#capacity .bar-row')]
                 .map((row) => [row.children[0].textContent, row.children[2].textContent]),
               runningRows: rows('running-list').length,
               parkedRows: rows('parked-list').length,
               tenants: rows('tenants-list').map((row) => row.slice(0, 3)),
             };",
            json!([]),
        )
        .await
        .expect("the page's numbers");
    assert_eq!(
        shown,
        json!({
            "running": "1",
            "parked": "3",
            "completed": "6",
            "bars": [["GPU VRAM", "8 / 24"]],
            "runningRows": 1,
            "parkedRows": 3,
            "tenants": [["acme", "1", "0"], ["anonymous (3 tasks)", "0", "3"]],
        }),
        "the first view"
    );
    // The throughput chart holds the six tasks at load, and both lines show: "started"
    // wide and blue, "ended" dashed and green over it (they are equal every second). Two
    // solid lines of one width, one over the other, left about 20 pixels of the lower one
    // in its colour (at the ends); these lines leave over 150 (the chart is 376 wide).
    // The chart is drawn on the page's next frame, which a loaded machine may delay: read
    // it until both lines show, within the page's patience.
    let pixels = "const canvas = document.querySelector('#chart-throughput canvas');
         const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
         const near = (i, [r, g, b]) => Math.abs(data[i] - r) < 12
             && Math.abs(data[i + 1] - g) < 12 && Math.abs(data[i + 2] - b) < 12;
         let started = 0, ended = 0;
         for (let i = 0; i < data.length; i += 4) {
           if (data[i + 3] < 200) continue;
           if (near(i, [47, 111, 237])) started += 1;
           if (near(i, [26, 158, 85])) ended += 1;
         }
         return [started, ended];";
    let deadline = Instant::now() + PATIENCE;
    loop {
        let colours = browser
            .script(pixels, json!([]))
            .await
            .expect("the chart's pixels");
        let [started, ended] = [0, 1].map(|index| colours[index].as_u64().unwrap_or(0));
        if started >= 80 && ended >= 20 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "both lines show: {started} started and {ended} ended pixels"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Tasks start and end all the time: every read of the page shows one instant.
    gate.store(true, Ordering::Release);
    let churn = {
        let client = pool.client().clone();
        tokio::spawn(async move {
            for id in 100..400u64 {
                let meta = TaskMetadata::new(id, ResourceCost::gpu_vram(1 + (id % 6) as u32));
                let task = prometheus_parking_lot::core::ScheduledTask::new(
                    meta,
                    format!("ms:{}", id % 40),
                );
                if client.submit(task, SubmitOptions::default()).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(8)).await;
            }
        })
    };
    let read = "const running = Number(document.getElementById('running-count').textContent);
                const rows = [...document.querySelectorAll('#running-list tr')];
                const held = rows.reduce((sum, tr) => sum + parseInt(tr.children[2].textContent, 10), 0);
                const bar = document.querySelector('#capacity .bar-row');
                const used = bar ? parseInt(bar.children[2].textContent, 10) : 0;
                return [running, rows.length, held, used];";
    let mut busy = 0;
    while !churn.is_finished() {
        let answer = browser.script(read, json!([])).await.expect("a read");
        let [running, rows, held, used] =
            [0, 1, 2, 3].map(|i| answer[i].as_u64().unwrap_or(u64::MAX));
        assert_eq!(
            (running, held),
            (rows, used),
            "the running count and list, the list's units and the bar: {answer}"
        );
        busy += usize::from(running > 0);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    churn.await.unwrap();
    assert!(busy > 0, "some reads saw tasks running");
    browser.quit().await;
}

// ------------------------------------------------------------------------------ the fleet

/// The executor of the fleet page's pools: returns its payload.
#[cfg(feature = "postgres")]
#[derive(Clone)]
struct Echo;

#[cfg(feature = "postgres")]
#[async_trait::async_trait]
impl prometheus_parking_lot::TaskExecutor<String, String> for Echo {
    async fn execute(&self, payload: String, _meta: TaskMetadata) -> String {
        payload
    }
}

/// A pool `work` on the shared Postgres queue `queue`, with an admin server on a free port.
#[cfg(feature = "postgres")]
fn fleet_config(
    queue: &str,
    workers: usize,
    units: u32,
) -> prometheus_parking_lot::SchedulerConfig {
    let text = json!({
        "database_url": database_url(),
        "fleet": { "heartbeat_ms": 200 },
        "admin": { "bind": "127.0.0.1:0", "token": TOKEN },
        "pools": { "work": {
            "worker_threads": workers,
            "max_units": units,
            "queue": { "type": "postgres", "queue_name": queue },
            "mailbox": { "storage": { "type": "postgres", "table": format!("{queue}_results") } }
        } }
    });
    prometheus_parking_lot::SchedulerConfig::from_json_str(&text.to_string())
        .expect("a valid fleet config")
}

/// The fleet page (`/fleet`, linked from the dashboard) lists the nodes of a shared Postgres
/// queue and a parked task with why it waits: larger than any node.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_page_lists_the_nodes_and_why_a_parked_task_waits() {
    use prometheus_parking_lot::core::ScheduledTask;
    use prometheus_parking_lot::{
        build_pools_from_scheduler_config, QueueBuilderContext, TokioSpawner,
    };

    let Some(driver) = Chromedriver::start_or_skip().await else {
        return;
    };
    let queue = format!("fleet_page_{}", std::process::id());
    let node_config = fleet_config(&queue, 1, 4);
    let node = build_pools_from_scheduler_config::<String, String, Echo, TokioSpawner>(
        &node_config,
        &QueueBuilderContext::Embedded,
        None,
        |_| Echo,
        TokioSpawner,
    )
    .expect("the node starts");
    let server = node
        .serve_admin(&node_config)
        .expect("the admin server starts")
        .expect("an admin section");
    let producer = build_pools_from_scheduler_config::<String, String, Echo, TokioSpawner>(
        &fleet_config(&queue, 0, 64),
        &QueueBuilderContext::Embedded,
        None,
        |_| Echo,
        TokioSpawner,
    )
    .expect("the producer starts");
    let meta = TaskMetadata::new(7, ResourceCost::cpu(16)).with_mailbox(MailboxKey::new("acme"));
    producer.pools["work"]
        .submit(ScheduledTask::new(meta, "big".into()))
        .await
        .expect("the producer parks it");

    let browser = Browser::open(&driver).await;
    browser.goto(&server.url()).await;
    browser
        .until_script(
            "const link = document.getElementById('fleet-link'); return link && link.getAttribute('href');",
            json!("fleet"),
            "the dashboard's link to the fleet page",
        )
        .await;
    browser.goto(&format!("{}fleet", server.url())).await;
    let pid = std::process::id().to_string();
    let nodes = browser
        .until_text("#nodes-list", "the two nodes", |text| {
            text.matches("live").count() == 2
        })
        .await;
    assert!(
        nodes.contains(&pid),
        "the nodes are this process's: {nodes}"
    );
    let parked = browser
        .until_text("#parked-list", "the parked task and its reason", |text| {
            text.contains("needs 16 cpu units")
        })
        .await;
    assert!(parked.contains("larger than any node"), "{parked}");
    assert!(parked.contains("acme"), "{parked}");
    browser.quit().await;

    producer.pools["work"]
        .cancel(&MailboxKey::new("acme"), 7)
        .await
        .expect("the parked task is cancelled");
    drop(server);
    drop(producer);
    drop(node);
    if let Ok(connection) = sea_orm::Database::connect(database_url()).await {
        use sea_orm::ConnectionTrait;
        for sql in [
            format!("DROP TABLE IF EXISTS {queue}_results"),
            format!("DELETE FROM pl_fleet_nodes WHERE queue_key = 'postgres table pl_queue_jobs {queue}'"),
        ] {
            let _ = connection.execute_unprepared(&sql).await;
        }
        let _ = connection.close().await;
    }
}

/// The test database.
#[cfg(feature = "postgres")]
fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}
