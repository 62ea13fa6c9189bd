//! A webhook receiver for tests (it serves as an OTLP endpoint too: any request with a
//! `Content-Length` body): a small HTTP/1.1 server on 127.0.0.1 (tokio's `TcpListener`,
//! keep-alive) that records every request and answers as the test's script says: a status,
//! optionally after a delay. It can be stopped (its port then refuses connections, open
//! connections are closed) and started again on the same port.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::{AbortHandle, JoinSet};

/// One request as the receiver got it.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// Header names in lower case.
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
    /// When it arrived, unix ms.
    pub received_at_ms: u64,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    /// The body's `delivery_id`.
    pub fn delivery_id(&self) -> String {
        self.json()["delivery_id"]
            .as_str()
            .expect("a delivery_id")
            .to_owned()
    }

    /// The body's `delivery_id` if it is JSON with one: a webhook's (an OTLP export, say,
    /// has none, and each of its requests counts as a first attempt).
    fn delivery_key(&self) -> Option<String> {
        let body: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        body["delivery_id"].as_str().map(str::to_owned)
    }
}

/// How to answer one request.
#[derive(Debug, Clone, Copy)]
pub struct Reply {
    pub status: u16,
    pub delay: Duration,
}

impl Reply {
    pub fn status(status: u16) -> Self {
        Self {
            status,
            delay: Duration::ZERO,
        }
    }

    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// Decides the answer from the request and how many requests with the same `delivery_id`
/// came before it (0 for the first attempt).
pub type Script = Arc<dyn Fn(&Request, usize) -> Reply + Send + Sync>;

struct Log {
    requests: Mutex<Requests>,
    arrived: Notify,
}

#[derive(Default)]
struct Requests {
    all: Vec<Request>,
    /// How many requests each delivery id came in.
    attempts: HashMap<String, usize>,
}

/// See the module docs.
pub struct Receiver {
    addr: SocketAddr,
    log: Arc<Log>,
    script: Script,
    server: Option<AbortHandle>,
}

impl Receiver {
    /// Answers 200 to everything.
    pub async fn ok() -> Self {
        Self::start(Arc::new(|_, _| Reply::status(200))).await
    }

    pub async fn start(script: Script) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let log = Arc::new(Log {
            requests: Mutex::new(Requests::default()),
            arrived: Notify::new(),
        });
        let server = Some(serve(listener, log.clone(), script.clone()));
        Self {
            addr,
            log,
            script,
            server,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/hooks/done", self.addr)
    }

    /// The receiver's base URL, with no path.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Closes the port and every open connection: the endpoint is down.
    pub fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }

    /// Listens on the same port again.
    pub async fn restart(&mut self) {
        self.stop();
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(listener) => break listener,
                Err(error) if tries < 100 => {
                    tries += 1;
                    let _ = error;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(error) => panic!("could not listen on {} again: {error}", self.addr),
            }
        };
        self.server = Some(serve(listener, self.log.clone(), self.script.clone()));
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        self.log.requests.lock().unwrap().all.clone()
    }

    /// How many requests arrived, and with how many distinct delivery ids.
    pub fn counts(&self) -> (usize, usize) {
        let requests = self.log.requests.lock().unwrap();
        (requests.all.len(), requests.attempts.len())
    }

    /// Waits until `check` holds for the requests so far; panics after `limit`.
    pub async fn wait_until(
        &self,
        limit: Duration,
        what: &str,
        check: impl Fn(&[Request]) -> bool,
    ) -> Vec<Request> {
        let deadline = Instant::now() + limit;
        loop {
            let arrived = self.log.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let requests = self.requests();
            if check(&requests) {
                return requests;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                panic!(
                    "not within {limit:?}: {what}; got {} requests: {:#?}",
                    requests.len(),
                    requests.iter().map(Request::json).collect::<Vec<_>>()
                );
            }
            let _ = tokio::time::timeout(left.min(Duration::from_millis(50)), arrived).await;
        }
    }

    /// Waits for `count` distinct `delivery_id`s.
    pub async fn wait_for_deliveries(&self, count: usize, limit: Duration) -> Vec<Request> {
        self.wait_until(limit, &format!("{count} distinct deliveries"), |requests| {
            distinct_deliveries(requests) >= count
        })
        .await
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How many distinct `delivery_id`s these requests carry.
pub fn distinct_deliveries(requests: &[Request]) -> usize {
    let ids: std::collections::HashSet<String> =
        requests.iter().map(Request::delivery_id).collect();
    ids.len()
}

fn serve(listener: TcpListener, log: Arc<Log>, script: Script) -> AbortHandle {
    tokio::spawn(async move {
        // Dropped with this task when the receiver stops: every connection closes too.
        let mut connections = JoinSet::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            connections.spawn(connection(stream, log.clone(), script.clone()));
            while connections.try_join_next().is_some() {}
        }
    })
    .abort_handle()
}

async fn connection(stream: TcpStream, log: Arc<Log>, script: Script) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    while let Some(request) = read_request(&mut read).await {
        let reply = {
            let mut requests = log.requests.lock().unwrap();
            let earlier = match request.delivery_key() {
                Some(id) => {
                    let attempts = requests.attempts.entry(id).or_default();
                    *attempts += 1;
                    *attempts - 1
                }
                None => 0,
            };
            requests.all.push(request.clone());
            script(&request, earlier)
        };
        log.arrived.notify_waiters();
        if !reply.delay.is_zero() {
            tokio::time::sleep(reply.delay).await;
        }
        let response = format!(
            "HTTP/1.1 {} Scripted\r\ncontent-length: 0\r\n\r\n",
            reply.status
        );
        if write.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}

async fn read_request<R: tokio::io::AsyncBufRead + Unpin>(read: &mut R) -> Option<Request> {
    let mut line = String::new();
    if read.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let path = parts.next()?.to_owned();
    let mut headers = HashMap::new();
    loop {
        let mut header = String::new();
        read.read_line(&mut header).await.ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
    }
    let length: usize = headers.get("content-length")?.parse().ok()?;
    let mut body = vec![0; length];
    read.read_exact(&mut body).await.ok()?;
    Some(Request {
        method,
        path,
        headers,
        body,
        received_at_ms: now_ms(),
    })
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}
