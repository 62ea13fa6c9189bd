//! The flag reader the examples share (`examples/support/flags.rs`): `--help` asks for the
//! usage, values come as `--name value` or `--name=value`, and a mistake is answered with
//! what was wrong and the usage.

#[path = "../../examples/support/flags.rs"]
mod flags;

use flags::Flags;

const USAGE: &str = "usage: demo [--port PORT] [--name NAME]";
const KNOWN: &[&str] = &["--port", "--name"];

fn parse(args: &[&str]) -> Result<Option<Flags>, String> {
    Flags::parse(args.iter().map(|arg| arg.to_string()), USAGE, KNOWN)
}

#[test]
fn help_asks_for_the_usage_wherever_it_stands() {
    for args in [&["--help"][..], &["-h"], &["--port", "80", "--help"]] {
        assert!(matches!(parse(args), Ok(None)), "{args:?}");
    }
}

#[test]
fn values_come_in_both_spellings_and_numbers_are_checked() {
    let flags = parse(&["--port=8080", "--name", "llm"]).unwrap().unwrap();
    assert_eq!(flags.text("--name"), Some("llm"));
    assert_eq!(flags.number::<u16>("--port", "a port"), Ok(Some(8080)));
    assert_eq!(flags.number::<u16>("--missing", "a port"), Ok(None));

    let flags = parse(&["--port", "99999"]).unwrap().unwrap();
    assert_eq!(
        flags.number::<u16>("--port", "a port from 1 to 65535"),
        Err(format!(
            "--port 99999: use a port from 1 to 65535\n\n{USAGE}"
        ))
    );
}

#[test]
fn mistakes_say_what_was_wrong_and_show_the_usage() {
    assert_eq!(
        parse(&["--bogus", "1"]).err(),
        Some(format!("unknown argument --bogus\n\n{USAGE}"))
    );
    assert_eq!(
        parse(&["--name"]).err(),
        Some(format!("--name needs a value\n\n{USAGE}"))
    );
}
