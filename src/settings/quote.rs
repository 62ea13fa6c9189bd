//! How configuration errors quote what the user wrote.
//!
//! An error message ends up in terminals and logs, so text taken from a configuration (pool
//! names, table names, URLs, stream names, unknown keys) is never copied into one as is:
//!
//! - control characters and invisible ones (a NUL, a line break, a right-to-left override)
//!   are escaped the way Rust's `Debug` escapes them (`\0`, `\n`, `\u{202e}`), so a message
//!   stays one readable line and cannot fake another;
//! - a value is cut after [`MAX_SHOWN_CHARS`] characters and marked with `…`, so a megabyte
//!   of garbage gives a short message;
//! - values read from the environment are never quoted at all: the loaders quote the
//!   configuration as written (`"${WEBHOOK_URL}"`), which holds no secret.

use serde_path_to_error::{Path, Segment};

/// Characters of a value shown in an error before it is cut.
pub(crate) const MAX_SHOWN_CHARS: usize = 64;

/// Characters of a message from serde (which quotes names and values itself) kept before it
/// is cut. The longest message serde gives about a valid document's shape, an unknown field
/// of a pool with the list of allowed ones, is about 400 characters with a 64-character key
/// (23 fields); the margin leaves room for a few more fields, whose names must not be cut
/// off the list a user reads.
const MAX_PROBLEM_CHARS: usize = 512;

/// A value in double quotes, escaped and cut: `"a\0b"`, `"aaaa"…`.
pub(crate) fn value(text: &str) -> String {
    let (kept, cut) = clip(text, MAX_SHOWN_CHARS);
    format!("{kept:?}{}", if cut { "…" } else { "" })
}

/// A name as part of a field path (`pools.NAME.queue`), escaped and cut, without quotes.
pub(crate) fn name(text: &str) -> String {
    let (kept, cut) = clip(text, MAX_SHOWN_CHARS);
    let mut shown = escape_controls(kept);
    if cut {
        shown.push('…');
    }
    shown
}

/// A field path as serde_path_to_error found it, each key shown with [`name`]; the document
/// itself is `(document)`.
pub(crate) fn path(path: &Path) -> String {
    let mut shown = String::new();
    for segment in path {
        match segment {
            Segment::Seq { index } => shown.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                push_separator(&mut shown);
                shown.push_str(&name(key));
            }
            Segment::Unknown => {
                push_separator(&mut shown);
                shown.push('?');
            }
        }
    }
    if shown.is_empty() {
        shown.push_str("(document)");
    }
    shown
}

/// A message written by serde or a parser, which may quote keys and values of its own:
/// control characters escaped, cut after [`MAX_PROBLEM_CHARS`] characters.
pub(crate) fn problem(text: &str) -> String {
    let mut shown = String::new();
    let mut shown_chars = 0;
    for c in text.chars() {
        if shown_chars >= MAX_PROBLEM_CHARS {
            shown.push('…');
            break;
        }
        let piece = if c.is_control() {
            escape_char(c)
        } else {
            c.to_string()
        };
        shown_chars += piece.chars().count();
        shown.push_str(&piece);
    }
    shown
}

/// `text` whole, safe to print to a terminal or a log: control and invisible characters (an
/// escape, a bell, a line break, a right-to-left override) are escaped the way Rust's `Debug`
/// escapes them, and so is the backslash, so an escaped form cannot be faked; quotes and
/// everything else stay as they are. The `parking-lot` command line shows what callers
/// wrote (tenants, keys, reasons) through it.
///
/// ```
/// use prometheus_parking_lot::config::escape_controls;
/// assert_eq!(escape_controls("acme"), "acme");
/// assert_eq!(escape_controls("a\u{1b}[2J\u{7}b"), r"a\u{1b}[2J\u{7}b");
/// assert_eq!(escape_controls(r"a\b"), r"a\\b");
/// ```
pub fn escape_controls(text: &str) -> String {
    text.chars().map(escape_char).collect()
}

fn push_separator(shown: &mut String) {
    if !shown.is_empty() {
        shown.push('.');
    }
}

/// `text` cut to at most `max` characters (never inside a character), and whether it was cut.
fn clip(text: &str, max: usize) -> (&str, bool) {
    match text.char_indices().nth(max) {
        Some((end, _)) => (&text[..end], true),
        None => (text, false),
    }
}

/// Escapes what `Debug` escapes, but leaves quotes alone: a path has none to balance.
fn escape_char(c: char) -> String {
    match c {
        '"' | '\'' => c.to_string(),
        c => c.escape_debug().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::{name, problem, value, MAX_PROBLEM_CHARS};

    #[test]
    fn control_characters_are_escaped_and_long_text_is_cut() {
        assert_eq!(value("a\0b\n\u{202e}"), r#""a\0b\n\u{202e}""#);
        assert_eq!(name("a\0b"), r"a\0b");
        assert_eq!(name("it's"), "it's");
        let long = "é".repeat(100);
        assert_eq!(value(&long), format!("\"{}\"…", "é".repeat(64)));
        assert_eq!(name(&long), format!("{}…", "é".repeat(64)));
        assert_eq!(problem("unknown field `a\nb`"), r"unknown field `a\nb`");
        assert_eq!(
            problem(&"x".repeat(1_000)).chars().count(),
            MAX_PROBLEM_CHARS + 1
        );
        assert!(problem(&"\u{7}".repeat(1_000)).chars().count() < MAX_PROBLEM_CHARS + 10);
    }
}
