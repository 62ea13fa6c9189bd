//! What the bench binaries share: how big a run is, and the median of its rounds.

#![allow(dead_code)]

/// Whether this is a measured run (`cargo bench` passes `--bench`) rather than the smoke test
/// `cargo test` runs.
pub fn measured() -> bool {
    std::env::args().any(|arg| arg == "--bench")
}

/// The environment variable `name` as a number, or `default` when it is unset or not one.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// The median of `values` (the upper one of an even count); 0 for none.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}
