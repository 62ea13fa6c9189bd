//! The command-line flags of the examples that take some: `--name value` or `--name=value`,
//! `--help` (or `-h`) for the usage, and errors that say what was wrong and show the usage.
//!
//! ```text
//! let flags = Flags::from_env(USAGE, &["--config", "--pool"])?; // --help prints USAGE, exits 0
//! let config = flags.text("--config").unwrap_or("config/local.json");
//! let seconds: u64 = flags.number("--seconds", "a whole number of seconds")?.unwrap_or(60);
//! ```

// Each example (and tests/compat/example_flags.rs) uses the part it needs.
#![allow(dead_code)]

use std::collections::HashMap;
use std::str::FromStr;

/// The flags given, by name.
pub struct Flags {
    values: HashMap<String, String>,
    usage: &'static str,
}

impl Flags {
    /// Reads the program's arguments. On `--help` or `-h` it prints `usage` and ends the
    /// program successfully; an unknown flag, or one without its value, is an error that ends
    /// with the usage.
    pub fn from_env(usage: &'static str, known: &[&str]) -> Result<Self, String> {
        match Self::parse(std::env::args().skip(1), usage, known)? {
            Some(flags) => Ok(flags),
            None => {
                println!("{usage}");
                std::process::exit(0);
            }
        }
    }

    /// Reads `args`; `None` when they ask for help.
    pub fn parse(
        args: impl IntoIterator<Item = String>,
        usage: &'static str,
        known: &[&str],
    ) -> Result<Option<Self>, String> {
        let mut values = HashMap::new();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "--help" || arg == "-h" {
                return Ok(None);
            }
            let (name, inline) = match arg.split_once('=') {
                Some((name, value)) => (name.to_owned(), Some(value.to_owned())),
                None => (arg, None),
            };
            if !known.contains(&name.as_str()) {
                return Err(format!("unknown argument {name}\n\n{usage}"));
            }
            let value = match inline.or_else(|| args.next()) {
                Some(value) => value,
                None => return Err(format!("{name} needs a value\n\n{usage}")),
            };
            values.insert(name, value);
        }
        Ok(Some(Self { values, usage }))
    }

    /// The text given for `name`, if any.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// The number given for `name`, if any; `what` says what is allowed (`a port from 1 to
    /// 65535`) when the text is not one.
    pub fn number<T: FromStr>(&self, name: &str, what: &str) -> Result<Option<T>, String> {
        let Some(text) = self.text(name) else {
            return Ok(None);
        };
        text.parse()
            .map(Some)
            .map_err(|_| format!("{name} {text}: use {what}\n\n{}", self.usage))
    }
}
