//! The configuration files shipped in `config/` send nothing to hosts we do not own: every
//! deployment address in them (a database URL, a webhook URL, anything with `://`, any field
//! named like an address) is an environment reference, `${NAME}`, and nothing else. Each
//! file still loads once those variables are set.

use std::path::{Path, PathBuf};

use prometheus_parking_lot::SchedulerConfig;
use serde_json::Value;

/// Every configuration file under `config/`.
fn shipped_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("config dir")
        .map(|item| item.expect("dir entry").path())
        .filter(|path| {
            path.extension()
                .is_some_and(|ext| ext == "json" || ext == "yaml" || ext == "yml")
        })
        .collect();
    files.sort();
    files
}

fn document(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("readable");
    if path.extension().is_some_and(|ext| ext == "json") {
        serde_json::from_str(&text).expect("JSON")
    } else {
        serde_saphyr::from_str(&text).expect("YAML")
    }
}

/// Whether `key: value` names a place on the network.
fn is_address(key: &str, value: &str) -> bool {
    let key = key.to_ascii_lowercase();
    value.contains("://")
        || key.ends_with("url")
        || key.ends_with("host")
        || key.ends_with("endpoint")
        || key.ends_with("address")
}

/// Whether `value` is exactly one `${NAME}` reference.
fn is_reference(value: &str) -> bool {
    value
        .strip_prefix("${")
        .and_then(|rest| rest.strip_suffix('}'))
        .is_some_and(|name| {
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// Every address of `value` as (field path, value).
fn addresses(path: &str, key: &str, value: &Value, found: &mut Vec<(String, String)>) {
    match value {
        Value::String(text) if is_address(key, text) => found.push((path.to_owned(), text.clone())),
        Value::Object(fields) => {
            for (name, inner) in fields {
                addresses(&format!("{path}.{name}"), name, inner, found);
            }
        }
        Value::Array(items) => {
            for (index, inner) in items.iter().enumerate() {
                addresses(&format!("{path}[{index}]"), key, inner, found);
            }
        }
        _ => {}
    }
}

#[test]
fn every_address_in_a_shipped_config_is_an_environment_reference() {
    let files = shipped_files();
    assert!(files.len() >= 4, "the shipped files: {files:?}");
    let mut checked = 0;
    for file in &files {
        let mut found = Vec::new();
        addresses("", "", &document(file), &mut found);
        for (field, value) in &found {
            assert!(
                is_reference(value),
                "{}: {} is {value:?}: a shipped config must name no host; write \"${{NAME}}\"",
                file.display(),
                field.trim_start_matches('.')
            );
        }
        checked += found.len();
    }
    assert!(checked >= 3, "the database and webhook URLs were seen");
}

#[test]
fn every_shipped_config_loads_with_its_references_set() {
    std::env::set_var("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test");
    std::env::set_var("WEBHOOK_URL", "https://hooks.internal.test/task-complete");
    std::env::set_var("PL_WEBHOOK_TOKEN", "token");
    for file in shipped_files() {
        let loaded = SchedulerConfig::from_path(&file);
        assert!(loaded.is_ok(), "{}: {loaded:?}", file.display());
    }
}
