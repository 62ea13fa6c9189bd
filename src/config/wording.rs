//! serde's messages about a configuration's shape, put in the configuration's words.
//!
//! serde speaks Rust: `expected usize`, `expected struct StarvationSettings`, `unknown
//! variant`, and for a misspelt key it lists every field the mapping allows. A person editing
//! a YAML file wants to hear `expected a whole number` and `did you mean max_units?`. This
//! module rewrites one message:
//!
//! - an unknown field or value close to an allowed one (`max_unit`, `maxUnits`, `notifer`)
//!   suggests it instead of listing them all; one close to none keeps the list;
//! - Rust type names become what a configuration writer would call them (`a whole number`,
//!   `a number`, `a mapping`, `a list`).
//!
//! Only the shape of serde's own English is matched; a message it does not recognise is
//! returned as it came.

/// The message in the configuration's words.
pub(super) fn problem(message: &str) -> String {
    let message = suggest_unknown(message).unwrap_or_else(|| message.to_owned());
    rust_types_in_config_words(&message)
}

/// `unknown field `X`, expected one of `a`, `b`` (or `unknown variant ...`) rewritten to
/// suggest the allowed name closest to `X`; `None` for any other message.
fn suggest_unknown(message: &str) -> Option<String> {
    let (what, rest) = [("field", "unknown field `"), ("value", "unknown variant `")]
        .into_iter()
        .find_map(|(what, prefix)| message.strip_prefix(prefix).map(|rest| (what, rest)))?;
    let end = ["`, expected ", "`, there are no "]
        .into_iter()
        .find_map(|separator| rest.find(separator))?;
    let (given, allowed) = (&rest[..end], &rest[end + 3..]);
    let allowed = allowed_names(allowed);
    if allowed.is_empty() {
        return Some(format!("unknown {what} `{given}`; this mapping takes none"));
    }
    Some(match closest(given, &allowed) {
        Some(likely) => format!("unknown {what} `{given}`; did you mean `{likely}`?"),
        None => format!("unknown {what} `{given}`; use {}", one_of(&allowed)),
    })
}

/// `a`, `a` or `b`, one of `a`, `b`, `c`.
fn one_of(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|name| format!("`{name}`")).collect();
    match quoted.as_slice() {
        [one] => one.clone(),
        [first, second] => format!("{first} or {second}"),
        _ => format!("one of {}", quoted.join(", ")),
    }
}

/// The names in serde's `expected one of `a`, `b``, `expected `a` or `b``, `expected `a``
/// (none for `there are no fields`).
fn allowed_names(list: &str) -> Vec<&str> {
    list.split('`')
        .skip(1)
        .step_by(2)
        .filter(|name| !name.is_empty())
        .collect()
}

/// The allowed name a person most likely meant by `given`: the nearest one, ignoring case,
/// `_` and `-`, when it is at most a third of its length away (one edit at least).
fn closest<'a>(given: &str, allowed: &[&'a str]) -> Option<&'a str> {
    let given = normalized(given);
    allowed
        .iter()
        .map(|name| (edit_distance(&given, &normalized(name)), *name))
        .filter(|(distance, name)| *distance <= (name.chars().count() / 3).max(1))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name)
}

/// Lower case, without the separators people write differently (`maxUnits`, `max-units`).
fn normalized(name: &str) -> Vec<char> {
    name.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

/// Edits (insert, delete, replace, swap two neighbours) that turn `a` into `b`.
fn edit_distance(a: &[char], b: &[char]) -> usize {
    // Row i holds the distances from a[..i] to every b[..j]; swaps also read row i - 2.
    let mut before: Vec<usize> = Vec::new();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut current = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let replace = usize::from(a[i - 1] != b[j - 1]);
            current[j] = (previous[j] + 1)
                .min(current[j - 1] + 1)
                .min(previous[j - 1] + replace);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                current[j] = current[j].min(before[j - 2] + 1);
            }
        }
        before = std::mem::replace(&mut previous, current);
    }
    previous[b.len()]
}

/// serde's Rust words, and what a configuration writer calls the same thing.
const RUST_WORDS: &[(&str, &str)] = &[
    ("expected usize", "expected a whole number (0 or more)"),
    ("expected u64", "expected a whole number (0 or more)"),
    (
        "expected u32",
        "expected a whole number from 0 to 4294967295",
    ),
    ("expected u16", "expected a whole number from 0 to 65535"),
    ("expected u8", "expected a whole number from 0 to 255"),
    ("expected i64", "expected a whole number"),
    ("expected i32", "expected a whole number"),
    ("expected f64", "expected a number"),
    ("expected f32", "expected a number"),
    ("expected a map", "expected a mapping ({ ... })"),
    ("expected a sequence", "expected a list ([ ... ])"),
    ("floating point `", "number `"),
];

/// Replaces serde's Rust type names; `struct X` and `internally tagged enum X` become a
/// mapping (with a `type` for the second).
fn rust_types_in_config_words(message: &str) -> String {
    if let Some(start) = message.find("expected internally tagged enum ") {
        return format!("{}expected a mapping with a `type`", &message[..start]);
    }
    if let Some(start) = message.find("expected struct ") {
        return format!(
            "{}expected a mapping of settings ({{ ... }})",
            &message[..start]
        );
    }
    let mut message = message.to_owned();
    for (rust, config) in RUST_WORDS {
        if let Some(start) = message.find(rust) {
            let end = start + rust.len();
            // `expected a map` must not match inside `expected a mapping`.
            let cut_word = rust.ends_with(|c: char| c.is_ascii_alphanumeric())
                && message[end..].starts_with(|c: char| c.is_ascii_alphanumeric());
            if !cut_word {
                message.replace_range(start..end, config);
            }
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use super::problem;

    const POOL_FIELDS: &str = "`worker_threads`, `thread_stack_size`, `max_units`, \
        `max_queue_depth`, `max_queued_units`, `order`, `default_timeout_secs`, `default_timeout_ms`, `pin_to_cpus`, \
        `starvation`, `fair_share`, `backfill`, `preemption`, `budgets`, `on_duplicate`, `retry`, `on_give_up`, `stream_idle_ms`, `admission`, `queue`, `mailbox`, `durability`, `spin_ms`, `gpu`";

    #[test]
    fn a_misspelt_field_suggests_the_likely_one() {
        let typo = |given: &str| {
            problem(&format!(
                "unknown field `{given}`, expected one of {POOL_FIELDS}"
            ))
        };
        assert_eq!(
            typo("max_unit"),
            "unknown field `max_unit`; did you mean `max_units`?"
        );
        assert_eq!(
            typo("maxUnits"),
            "unknown field `maxUnits`; did you mean `max_units`?"
        );
        assert_eq!(
            typo("wroker_threads"),
            "unknown field `wroker_threads`; did you mean `worker_threads`?"
        );
        assert_eq!(
            problem("unknown field `pth`, expected `path` or `stream`"),
            "unknown field `pth`; did you mean `path`?"
        );
        assert_eq!(
            problem("unknown field `max_message`, expected `max_messages`"),
            "unknown field `max_message`; did you mean `max_messages`?"
        );
    }

    #[test]
    fn a_field_close_to_none_lists_the_allowed_ones() {
        assert_eq!(
            problem(&format!(
                "unknown field `zzzzzzzz`, expected one of {POOL_FIELDS}"
            )),
            format!("unknown field `zzzzzzzz`; use one of {POOL_FIELDS}")
        );
        assert_eq!(
            problem("unknown field `zzz`, expected `pools` or `database_url`"),
            "unknown field `zzz`; use `pools` or `database_url`"
        );
        assert_eq!(
            problem("unknown field `x`, there are no fields"),
            "unknown field `x`; this mapping takes none"
        );
    }

    #[test]
    fn an_unknown_variant_is_an_unknown_value() {
        assert_eq!(
            problem(
                "unknown variant `yaqe`, expected one of `in_memory`, `yaque`, `postgres`, \
                 `postgres_pgmq`"
            ),
            "unknown value `yaqe`; did you mean `yaque`?"
        );
        assert_eq!(
            problem("unknown variant `x`, expected `accepted` or `parked`"),
            "unknown value `x`; use `accepted` or `parked`"
        );
    }

    #[test]
    fn rust_type_names_become_config_words() {
        assert_eq!(
            problem("invalid type: string \"x\", expected usize"),
            "invalid type: string \"x\", expected a whole number (0 or more)"
        );
        assert_eq!(
            problem("invalid value: integer `5000000000`, expected u32"),
            "invalid value: integer `5000000000`, expected a whole number from 0 to 4294967295"
        );
        assert_eq!(
            problem("invalid type: floating point `1.5`, expected usize"),
            "invalid type: number `1.5`, expected a whole number (0 or more)"
        );
        assert_eq!(
            problem("invalid type: string \"x\", expected f64"),
            "invalid type: string \"x\", expected a number"
        );
        assert_eq!(
            problem("invalid type: integer `3`, expected struct StarvationSettings"),
            "invalid type: integer `3`, expected a mapping of settings ({ ... })"
        );
        assert_eq!(
            problem("invalid type: integer `3`, expected internally tagged enum QueueSettings"),
            "invalid type: integer `3`, expected a mapping with a `type`"
        );
        assert_eq!(
            problem("invalid type: integer `3`, expected a sequence"),
            "invalid type: integer `3`, expected a list ([ ... ])"
        );
        assert_eq!(
            problem("invalid type: integer `3`, expected a map"),
            "invalid type: integer `3`, expected a mapping ({ ... })"
        );
    }

    #[test]
    fn other_messages_are_kept() {
        for message in [
            "missing field `type`",
            "invalid type: string \"yes\", expected a boolean",
            "invalid value: string \"x\", expected a whole number of units or \"auto\"",
            "invalid type: integer `3`, expected a string",
        ] {
            assert_eq!(problem(message), message);
        }
    }
}
