//! What this build of the crate has, for tests of messages that list it.
//!
//! A pool builder that meets a backend this build lacks ends its error with `available
//! here: ...`, naming what the enabled cargo features provide. Tests check that list against
//! `cfg!` so they hold in every feature set CI builds (default, all, each one alone).

// Each test file uses the part it needs.
#![allow(dead_code)]

/// Asserts that `message` ends with the list of what this build has: every backend of an
/// enabled feature named, none of a disabled one.
pub fn assert_lists_what_this_build_has(message: &str) {
    let (_, available) = message
        .split_once("available here: ")
        .unwrap_or_else(|| panic!("no list of what is available in {message:?}"));
    assert!(
        available.starts_with("the in_memory"),
        "the in-memory backends come first: {available:?}"
    );
    let named = [
        ("yaque", cfg!(feature = "yaque")),
        ("postgres", cfg!(feature = "postgres")),
        ("postgres_pgmq", cfg!(feature = "pgmq")),
        ("the http notifier", cfg!(feature = "webhook")),
        ("\"auto\"", cfg!(feature = "gpu")),
    ];
    for (name, built) in named {
        assert_eq!(
            available.contains(name),
            built,
            "{name} should be listed exactly when its feature is on: {available:?}"
        );
    }
    assert!(available.ends_with("for max_units"), "{available:?}");
}

/// Whether this build has the cargo feature `feature` of the root crate.
pub fn built_with(feature: &str) -> bool {
    match feature {
        "metrics" => cfg!(feature = "metrics"),
        "postgres" => cfg!(feature = "postgres"),
        "pgmq" => cfg!(feature = "pgmq"),
        "gpu" => cfg!(feature = "gpu"),
        "yaque" => cfg!(feature = "yaque"),
        "webhook" => cfg!(feature = "webhook"),
        other => panic!("{other} is no feature of prometheus_parking_lot"),
    }
}
