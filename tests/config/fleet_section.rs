//! The configuration's `fleet` section: the heartbeat of the nodes of a shared Postgres queue.

use std::time::Duration;

use prometheus_parking_lot::config::FleetSection;
use prometheus_parking_lot::SchedulerConfig;

fn with_fleet(fleet: &str) -> String {
    format!(r#"{{ "pools": {{ "p": {{}} }}, "fleet": {fleet} }}"#)
}

#[test]
fn the_fleet_section_sets_the_heartbeat_and_is_checked() {
    let config = SchedulerConfig::from_json_str(&with_fleet(r#"{ "heartbeat_ms": 200 }"#))
        .expect("a valid fleet section");
    let fleet = config.fleet.expect("the section");
    assert_eq!(fleet.heartbeat(), Duration::from_millis(200));
    assert_eq!(
        FleetSection::default().heartbeat(),
        Duration::from_secs(5),
        "the default heartbeat"
    );
    let none = SchedulerConfig::from_json_str(r#"{ "pools": { "p": {} } }"#).unwrap();
    assert_eq!(none.fleet, None);

    for (fleet, expected) in [
        (
            r#"{ "heartbeat_ms": 10 }"#,
            "fleet.heartbeat_ms: 10 is out of range; use a whole number of milliseconds from 50 to 600000 (a node is stale after three missed heartbeats)",
        ),
        (
            r#"{ "heartbeat_ms": 600001 }"#,
            "fleet.heartbeat_ms: 600001 is out of range; use a whole number of milliseconds from 50 to 600000 (a node is stale after three missed heartbeats)",
        ),
    ] {
        let error = SchedulerConfig::from_json_str(&with_fleet(fleet)).unwrap_err();
        assert_eq!(error.to_string(), expected);
    }
    let typo = SchedulerConfig::from_json_str(&with_fleet(r#"{ "heartbeat": 200 }"#)).unwrap_err();
    assert!(
        typo.to_string()
            .starts_with("fleet.heartbeat: unknown field `heartbeat`"),
        "{typo}"
    );
}
