//! When a schedule ticks: a cron expression read in a time zone, or a fixed period.
//!
//! Every node of a fleet must name the same instants for a schedule, since a tick's identity
//! is its instant (the key a shared queue keeps it under). A cron expression gives that by
//! itself; a period is aligned to the Unix epoch (an hourly period ticks on the hour in UTC,
//! whenever a node started), never to a node's start.

use std::time::Duration;

use croner::parser::{CronParser, Seconds};
use croner::Cron;
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};

use super::ScheduleError;

/// The shortest period a schedule may have: below it, a fleet would spend more on agreeing
/// who enqueues a tick than on the tick.
pub const MIN_PERIOD: Duration = Duration::from_millis(100);

/// When a schedule ticks.
#[derive(Debug, Clone)]
pub enum Timing {
    /// At the instants a cron expression names, read as wall-clock time in a zone (boxed:
    /// a parsed expression is some 370 bytes, a period 16).
    Cron(Box<CronTiming>),
    /// Every period, at multiples of it since the Unix epoch.
    Every(Duration),
}

/// A cron expression and the zone it is read in.
#[derive(Debug, Clone)]
pub struct CronTiming {
    /// The expression as written.
    expression: String,
    /// The zone's IANA name as written.
    zone_name: String,
    cron: Cron,
    zone: TimeZone,
}

impl PartialEq for Timing {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Timing::Cron(a), Timing::Cron(b)) => {
                a.expression == b.expression && a.zone_name == b.zone_name
            }
            (Timing::Every(a), Timing::Every(b)) => a == b,
            _ => false,
        }
    }
}

impl Timing {
    /// A cron expression read in the IANA zone `zone` (`"Europe/Paris"`, `"UTC"`): five fields
    /// (minute, hour, day of month, month, day of week) or six with seconds first.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::schedule::Timing;
    ///
    /// assert!(Timing::cron("0 2 * * *", "Europe/Paris").is_ok());
    /// assert!(Timing::cron("0 25 * * *", "UTC").is_err());
    /// assert!(Timing::cron("0 2 * * *", "Mars/Olympus").is_err());
    /// ```
    pub fn cron(expression: &str, zone: &str) -> Result<Self, ScheduleError> {
        let parser = CronParser::builder().seconds(Seconds::Optional).build();
        let cron = parser
            .parse(expression)
            .map_err(|error| ScheduleError::Cron {
                expression: expression.to_owned(),
                reason: error.to_string(),
            })?;
        let tz = TimeZone::get(zone).map_err(|_| ScheduleError::Zone {
            zone: zone.to_owned(),
        })?;
        Ok(Timing::Cron(Box::new(CronTiming {
            expression: expression.to_owned(),
            zone_name: zone.to_owned(),
            cron,
            zone: tz,
        })))
    }

    /// Every `period` (at least [`MIN_PERIOD`]), at multiples of it since the Unix epoch.
    pub fn every(period: Duration) -> Result<Self, ScheduleError> {
        if period < MIN_PERIOD {
            return Err(ScheduleError::Period { period });
        }
        Ok(Timing::Every(period))
    }

    /// The expression as a person reads it: the cron expression, or `every 5s`.
    pub fn expression(&self) -> String {
        match self {
            Timing::Cron(cron) => cron.expression.clone(),
            Timing::Every(period) => format!("every {period:?}"),
        }
    }

    /// The zone a cron expression is read in; `None` for a period.
    pub fn zone(&self) -> Option<&str> {
        match self {
            Timing::Cron(cron) => Some(&cron.zone_name),
            Timing::Every(_) => None,
        }
    }

    /// The first tick strictly after `after_ms` (milliseconds since the Unix epoch); `None`
    /// when the expression names no later instant.
    pub fn next_after(&self, after_ms: u64) -> Option<u64> {
        match self {
            Timing::Every(period) => {
                let period = period_ms(*period);
                (after_ms / period).checked_add(1)?.checked_mul(period)
            }
            Timing::Cron(cron) => {
                let mut from = cron.zoned(after_ms)?;
                loop {
                    let next = cron.cron.find_next_occurrence(&from, false).ok()?;
                    let next_ms = millis_of(&next)?;
                    if next_ms > after_ms {
                        return Some(next_ms);
                    }
                    from = next;
                }
            }
        }
    }

    /// The latest tick at or before `at_ms`; `None` when there is none.
    pub fn latest_at_or_before(&self, at_ms: u64) -> Option<u64> {
        match self {
            Timing::Every(period) => {
                let period = period_ms(*period);
                Some(at_ms / period * period)
            }
            Timing::Cron(cron) => {
                let mut from = cron.zoned(at_ms)?;
                let mut inclusive = true;
                loop {
                    let previous = cron.cron.find_previous_occurrence(&from, inclusive).ok()?;
                    let previous_ms = millis_of(&previous)?;
                    if previous_ms <= at_ms {
                        return Some(previous_ms);
                    }
                    from = previous;
                    inclusive = false;
                }
            }
        }
    }
}

impl CronTiming {
    /// `at_ms` as a time in the expression's zone.
    fn zoned(&self, at_ms: u64) -> Option<Zoned> {
        let at = Timestamp::from_millisecond(i64::try_from(at_ms).ok()?).ok()?;
        Some(at.to_zoned(self.zone.clone()))
    }
}

fn period_ms(period: Duration) -> u64 {
    u64::try_from(period.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn millis_of(at: &Zoned) -> Option<u64> {
    u64::try_from(at.timestamp().as_millisecond()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-01-15 00:00:00 UTC.
    const JAN_15: u64 = 1_768_435_200_000;
    const HOUR: u64 = 3_600_000;

    #[test]
    fn a_cron_expression_ticks_at_its_wall_clock_time_in_its_zone() {
        // 02:00 in Paris is 01:00 UTC in January.
        let nightly = Timing::cron("0 2 * * *", "Europe/Paris").unwrap();
        assert_eq!(nightly.next_after(JAN_15), Some(JAN_15 + HOUR));
        assert_eq!(nightly.next_after(JAN_15 + HOUR), Some(JAN_15 + 25 * HOUR));
        assert_eq!(
            nightly.latest_at_or_before(JAN_15 + HOUR),
            Some(JAN_15 + HOUR)
        );
        assert_eq!(
            nightly.latest_at_or_before(JAN_15 + HOUR - 1),
            Some(JAN_15 + HOUR - 24 * HOUR)
        );
    }

    #[test]
    fn seconds_are_an_optional_sixth_field() {
        let every_second = Timing::cron("* * * * * *", "UTC").unwrap();
        assert_eq!(every_second.next_after(JAN_15 + 500), Some(JAN_15 + 1_000));
        assert_eq!(
            every_second.latest_at_or_before(JAN_15 + 1_500),
            Some(JAN_15 + 1_000)
        );
    }

    #[test]
    fn a_period_ticks_at_multiples_of_itself_since_the_epoch() {
        let hourly = Timing::every(Duration::from_secs(3_600)).unwrap();
        assert_eq!(hourly.next_after(JAN_15 + 10), Some(JAN_15 + HOUR));
        assert_eq!(hourly.next_after(JAN_15), Some(JAN_15 + HOUR));
        assert_eq!(hourly.latest_at_or_before(JAN_15 + HOUR - 1), Some(JAN_15));
    }

    #[test]
    fn bad_expressions_zones_and_periods_are_refused() {
        assert!(matches!(
            Timing::cron("every day", "UTC"),
            Err(ScheduleError::Cron { .. })
        ));
        assert!(matches!(
            Timing::cron("0 2 * * *", "Europe/Atlantis"),
            Err(ScheduleError::Zone { .. })
        ));
        assert!(matches!(
            Timing::every(Duration::from_millis(5)),
            Err(ScheduleError::Period { .. })
        ));
    }
}
