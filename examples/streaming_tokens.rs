//! Streaming tokens from a fake LLM to two clients; one disconnects halfway.
//!
//! Each generation holds 8 of the pool's 24 VRAM units for as long as its executor runs,
//! not just while it sets up. Client A reads its whole answer; client B drops its stream
//! after half its tokens, and the output shows B's units coming back at that moment, not
//! when B's generation would have ended. The executor is a blocking token loop, as a sync
//! inference call would be: it checks the cancellation flag between tokens.
//!
//! ```text
//! cargo run --example streaming_tokens
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::StreamExt;
use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::{PoolError, TaskMetadata, WorkerExecutor, WorkerPool};
use prometheus_parking_lot::running;
use prometheus_parking_lot::util::serde::ResourceCost;

/// Tokens per answer.
const TOKENS: u32 = 20;
/// How long the fake model takes per token.
const TOKEN_TIME: Duration = Duration::from_millis(50);
/// The VRAM units one generation holds.
const UNITS: u32 = 8;
/// Client B leaves after this many tokens.
const B_READS: usize = 10;

#[derive(Clone)]
struct FakeLlm;

#[async_trait]
impl WorkerExecutor<String, String> for FakeLlm {
    async fn execute(&self, prompt: String, _meta: TaskMetadata) -> String {
        let partials = running::partials::<String>();
        let mut answer = String::new();
        for n in 0..TOKENS {
            if running::is_cancelled() {
                break; // the client is gone: stop generating, free the card
            }
            std::thread::sleep(TOKEN_TIME); // the "forward pass"
            let token = format!("{prompt}-{n} ");
            if let Some(partials) = &partials {
                if partials.send_blocking(token.clone()).is_err() {
                    break;
                }
            }
            answer.push_str(&token);
        }
        answer
    }
}

type Pool = WorkerPool<String, String, FakeLlm>;

fn say(start: Instant, pool: &Pool, what: &str) {
    let stats = pool.stats();
    println!(
        "{:>5} ms  {what:<44} used {:>2} of {} units",
        start.elapsed().as_millis(),
        stats.used_units,
        stats.total_units
    );
}

async fn client(
    pool: Arc<Pool>,
    start: Instant,
    name: &'static str,
    id: u64,
    reads: Option<usize>,
) -> Result<(), PoolError> {
    let meta = TaskMetadata::new(id, ResourceCost::gpu_vram(UNITS));
    let mut stream = pool.submit_streaming(name.to_owned(), meta, 4).await?;
    say(start, &pool, &format!("client {name} starts streaming"));
    let mut tokens = 0;
    while let Some(item) = stream.next().await {
        let text = item?;
        tokens += 1;
        if tokens == TOKENS as usize + 1 {
            say(start, &pool, &format!("client {name} got the final answer"));
            return Ok(());
        }
        if Some(tokens) == reads {
            say(
                start,
                &pool,
                &format!("client {name} disconnects after {text:?}"),
            );
            drop(stream);
            let dropped = Instant::now();
            while pool.stats().used_units as u32 > UNITS {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            say(
                start,
                &pool,
                &format!(
                    "client {name}'s units are back ({} ms later)",
                    dropped.elapsed().as_millis()
                ),
            );
            return Ok(());
        }
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), PoolError> {
    let config = WorkerPoolConfig::new()
        .with_name("llm")
        .with_worker_count(2)
        .with_max_units(24);
    let pool = Arc::new(WorkerPool::new(config, FakeLlm)?);
    let start = Instant::now();
    let generation = TOKEN_TIME * TOKENS;
    println!(
        "two clients, {TOKENS} tokens each, {} ms per token: a generation takes about {} ms",
        TOKEN_TIME.as_millis(),
        generation.as_millis()
    );
    let a = tokio::spawn(client(pool.clone(), start, "A", 1, None));
    let b = tokio::spawn(client(pool.clone(), start, "B", 2, Some(B_READS)));
    b.await.expect("client B ran")?;
    a.await.expect("client A ran")?;
    say(start, &pool, "both clients done");
    pool.shutdown_with_drain(Duration::from_secs(5)).await?;
    Ok(())
}
