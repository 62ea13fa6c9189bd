//! A test binary that is also its own child process: the harness of the multi-process tests.
//!
//! Such a file sets `harness = false` and its `main` calls [`main`] with its tests and its
//! child roles. Started by a test with [`ROLE_ENV`] set, the binary plays that role and exits;
//! otherwise it runs the tests (the ones whose names contain a filter given on the command
//! line, or all), reports each as `cargo test` does, and fails if one did. So a child's entry
//! point is not a test, and no test is ignored.

#![allow(dead_code)]

use std::process::Command;

/// The environment variable that names the role a child process plays.
pub const ROLE_ENV: &str = "PL_TEST_CHILD_ROLE";

/// A test: its name and its body (a panic fails it).
pub type Case = (&'static str, fn());

/// Plays the role [`ROLE_ENV`] names, or runs `tests`.
pub fn main(tests: &[Case], roles: &[Case]) {
    if let Ok(role) = std::env::var(ROLE_ENV) {
        let Some((_, play)) = roles.iter().find(|(name, _)| *name == role) else {
            panic!("unknown child role {role:?}");
        };
        play();
        return;
    }
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .collect();
    let chosen: Vec<&Case> = tests
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    println!("\nrunning {} tests", chosen.len());
    let mut failed = Vec::new();
    for (name, test) in chosen.iter().copied() {
        let outcome = std::panic::catch_unwind(test);
        println!(
            "test {name} ... {}",
            if outcome.is_ok() { "ok" } else { "FAILED" }
        );
        if outcome.is_err() {
            failed.push(*name);
        }
    }
    let passed = chosen.len() - failed.len();
    println!(
        "\ntest result: {}. {passed} passed; {} failed\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        failed.len()
    );
    if !failed.is_empty() {
        std::process::exit(101);
    }
}

/// A command that starts this test binary as a child playing `role`.
pub fn child(role: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("this test binary"));
    command.env(ROLE_ENV, role);
    command
}

/// Runs `test` on a two-thread tokio runtime, as `#[tokio::test(flavor = "multi_thread")]`.
pub fn on_runtime<F: std::future::Future<Output = ()>>(test: F) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(test);
}

/// A node: a child process of this test binary playing `role`, told its settings in one
/// environment variable and asked to stop by closing its stdin. Killed when dropped, so a
/// failing test leaves none behind.
pub struct NodeProcess {
    child: std::process::Child,
}

impl NodeProcess {
    /// Starts `role` with `settings` in the environment variable `env` (its stdout
    /// discarded, its stderr the test's).
    pub fn start(role: &str, env: &str, settings: String) -> Self {
        let child = child(role)
            .env(env, settings)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start a node");
        Self { child }
    }

    /// Closes the node's stdin and waits, at most `within`, for it to stop.
    pub fn stop(&mut self, within: std::time::Duration) {
        drop(self.child.stdin.take());
        let deadline = std::time::Instant::now() + within;
        while self.child.try_wait().expect("wait for a node").is_none() {
            assert!(std::time::Instant::now() < deadline, "a node did not stop");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Blocks until stdin closes: how a node process waits to be asked to stop.
pub fn wait_for_stdin_to_close() {
    let _ = std::io::stdin().read_line(&mut String::new());
}

/// The lines of the file at `path` (none while it does not exist).
pub fn read_lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}
