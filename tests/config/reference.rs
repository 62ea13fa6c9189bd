//! The configuration reference (`docs/guide/configuration.md`) names every field the file
//! format accepts: each section is given a field it does not know, and every field its error
//! lists as allowed must appear in the reference, so a field added to a settings type without
//! a line there fails here.

use prometheus_parking_lot::SchedulerConfig;

/// A field no section has, far from every real name (so the error lists them all rather than
/// suggesting one).
const UNKNOWN: &str = "zzzzzzzzzz";

/// The fields a document's error lists as allowed: the names in backquotes after "; use".
fn allowed_fields(document: &str) -> Vec<String> {
    let error = SchedulerConfig::from_json_str(document)
        .expect_err("an unknown field is refused")
        .to_string();
    let (_, allowed) = error
        .split_once("; use ")
        .unwrap_or_else(|| panic!("{document}: the error lists no fields: {error}"));
    allowed
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// A document with the unknown field inside `section`, a JSON object written with `@` where
/// the field goes, under one pool named `p`.
fn in_pool(section: &str) -> String {
    let field = format!("\"{UNKNOWN}\": 1");
    format!(r#"{{"pools": {{"p": {}}}}}"#, section.replace('@', &field))
}

#[test]
fn the_reference_names_every_field_of_every_section() {
    let reference = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/guide/configuration.md"
    ))
    .expect("the guide's configuration chapter");
    let top = [
        format!(r#"{{"{UNKNOWN}": 1, "pools": {{}}}}"#),
        format!(r#"{{"pools": {{}}, "admin": {{"{UNKNOWN}": 1}}}}"#),
        format!(r#"{{"pools": {{}}, "fleet": {{"{UNKNOWN}": 1}}}}"#),
    ];
    let pool_sections = [
        "{@}",
        r#"{"starvation": {@}}"#,
        r#"{"fair_share": {@}}"#,
        r#"{"fair_share": {"by_use": {@}}}"#,
        r#"{"preemption": {@}}"#,
        r#"{"admission": {@}}"#,
        r#"{"retry": {@}}"#,
        r#"{"budgets": {"io": {@}}}"#,
        r#"{"budgets": {"io": {"max_starts": {@}}}}"#,
        r#"{"gpu": {@}}"#,
        r#"{"schedules": [{@}]}"#,
        r#"{"schedules": [{"cost": {@}}]}"#,
        r#"{"queue": {"type": "yaque", @}}"#,
        r#"{"queue": {"type": "postgres", @}}"#,
        r#"{"queue": {"type": "postgres_pgmq", @}}"#,
        r#"{"mailbox": {@}}"#,
        r#"{"mailbox": {"storage": {"type": "in_memory", @}}}"#,
        r#"{"mailbox": {"storage": {"type": "postgres", @}}}"#,
        r#"{"mailbox": {"notifier": {"type": "http", @}}}"#,
    ];
    let documents = top
        .into_iter()
        .chain(pool_sections.iter().map(|section| in_pool(section)));
    let mut missing = Vec::new();
    let mut checked = 0;
    for document in documents {
        for field in allowed_fields(&document) {
            checked += 1;
            if !reference.contains(&format!("`{field}`")) {
                missing.push(format!("{field} (from {document})"));
            }
        }
    }
    assert!(
        checked > 60,
        "only {checked} fields were listed by the errors"
    );
    assert!(
        missing.is_empty(),
        "docs/guide/configuration.md does not name: {missing:#?}"
    );
}
