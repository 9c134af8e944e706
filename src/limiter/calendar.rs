//! Calendar-aligned windows: a fixed window of a day, week, month or year that starts at
//! local midnight in an IANA time zone instead of at a multiple of its nominal length since
//! the epoch.
//!
//! Calendar windows have the length of the calendar, not of [`Unit::seconds`]: a day across a
//! daylight-saving change lasts 23 or 25 hours, a month 28 to 31 days (give or take that
//! hour). The window is always one unit: `unit_multiplier` does not apply.

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use super::{SECOND_MICROS, Unit};

/// An IANA time zone for calendar-aligned fixed windows.
#[derive(Debug, Clone)]
pub struct Timezone {
    /// The canonical IANA name (`Europe/Paris` even when parsed from `europe/paris`), so one
    /// zone always yields one counter key.
    name: Box<str>,
    zone: TimeZone,
}

impl PartialEq for Timezone {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Timezone {}

impl Timezone {
    /// Looks `name` up in the system time zone database (or the copy bundled at build time).
    pub fn parse(name: &str) -> Result<Self, String> {
        let zone = TimeZone::get(name).map_err(|e| format!("unknown time zone {name:?}: {e}"))?;
        let name = zone.iana_name().unwrap_or(name).into();
        Ok(Timezone { name, zone })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The [start, end) of the calendar window of `unit` containing `now_micros`: day = local
    /// midnight to the next local midnight, week = from Monday (ISO week), month = from the
    /// 1st, year = from January 1st. "Midnight" is the first instant of the local day, which is
    /// later than 00:00 in the rare zones whose clocks jump over midnight.
    ///
    /// Seconds, minutes and hours are not calendar units (the rule loader rejects them with a
    /// time zone); they, and instants outside what the time zone database covers, fall back to
    /// epoch-aligned windows of the unit's nominal length, so this never fails.
    pub fn window(&self, unit: Unit, now_micros: u64) -> (u64, u64) {
        self.calendar_window(unit, now_micros)
            .filter(|&(start, end)| start <= now_micros && now_micros < end)
            .unwrap_or_else(|| epoch_window(unit, now_micros))
    }

    fn calendar_window(&self, unit: Unit, now_micros: u64) -> Option<(u64, u64)> {
        let now = Timestamp::from_microsecond(i64::try_from(now_micros).ok()?).ok()?;
        let today = self.zone.to_datetime(now).date();
        let (first, next) = match unit {
            Unit::Second | Unit::Minute | Unit::Hour => return None,
            Unit::Day => (today, today.tomorrow().ok()?),
            Unit::Week => {
                let since_monday = today.weekday().to_monday_zero_offset();
                let monday = today.checked_sub(i64::from(since_monday).days()).ok()?;
                (monday, monday.checked_add(7.days()).ok()?)
            }
            Unit::Month => {
                let first = today.first_of_month();
                (first, first.checked_add(1.month()).ok()?)
            }
            Unit::Year => {
                let first = today.first_of_year();
                (first, first.checked_add(1.year()).ok()?)
            }
        };
        Some((self.start_of(first)?, self.start_of(next)?))
    }

    /// The first instant of local day `date`, in microseconds since the epoch. "Compatible"
    /// disambiguation maps a midnight skipped by a clock change to the instant after the gap,
    /// and a repeated midnight to its first occurrence.
    fn start_of(&self, date: Date) -> Option<u64> {
        let midnight = self
            .zone
            .to_ambiguous_timestamp(date.at(0, 0, 0, 0))
            .compatible()
            .ok()?;
        u64::try_from(midnight.as_microsecond()).ok()
    }
}

/// The window of the unit's nominal length that contains `now_micros`, aligned on the epoch.
fn epoch_window(unit: Unit, now_micros: u64) -> (u64, u64) {
    let length = unit.seconds() * SECOND_MICROS;
    let start = now_micros - now_micros % length;
    (start, start.saturating_add(length))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600 * SECOND_MICROS;
    const DAY: u64 = 24 * HOUR;

    fn paris() -> Timezone {
        Timezone::parse("Europe/Paris").expect("Europe/Paris is in every tz database")
    }

    /// Microseconds since the epoch of a whole number of seconds.
    fn at(seconds: u64) -> u64 {
        seconds * SECOND_MICROS
    }

    #[test]
    fn unknown_zone_is_an_error() {
        assert!(Timezone::parse("Mars/Olympus_Mons").is_err());
    }

    #[test]
    fn name_is_canonical_whatever_the_case_it_was_parsed_in() {
        let zone = Timezone::parse("europe/paris").expect("zone lookups ignore case");
        assert_eq!(zone.name(), "Europe/Paris");
        assert_eq!(zone, paris());
    }

    #[test]
    fn day_starts_at_local_midnight_not_utc_midnight() {
        // 2023-11-15T00:00:00Z is 01:00 in Paris (UTC+1); the day began an hour earlier.
        let utc_midnight = at(1_700_006_400);
        assert_eq!(
            paris().window(Unit::Day, utc_midnight),
            (utc_midnight - HOUR, utc_midnight + 23 * HOUR)
        );
    }

    #[test]
    fn spring_forward_day_lasts_23_hours() {
        let local_midnight = at(1_711_839_600); // 2024-03-31T00:00+01:00
        let (start, end) = paris().window(Unit::Day, local_midnight + 12 * HOUR);
        assert_eq!((start, end - start), (local_midnight, 23 * HOUR));
    }

    #[test]
    fn fall_back_day_lasts_25_hours() {
        let local_midnight = at(1_729_980_000); // 2024-10-27T00:00+02:00
        let (start, end) = paris().window(Unit::Day, local_midnight + 12 * HOUR);
        assert_eq!((start, end - start), (local_midnight, 25 * HOUR));
    }

    #[test]
    fn week_starts_on_monday_at_local_midnight() {
        // Wednesday 2023-11-15 12:00 in Paris; Monday 13th began at 2023-11-12T23:00:00Z.
        let wednesday_noon = at(1_700_002_800) + 12 * HOUR;
        let monday = at(1_700_002_800) - 2 * DAY;
        assert_eq!(
            paris().window(Unit::Week, wednesday_noon),
            (monday, monday + 7 * DAY)
        );
    }

    #[test]
    fn month_starts_on_the_first_and_lasts_the_calendar_month() {
        let february = at(1_706_742_000); // 2024-02-01T00:00+01:00, a leap year
        assert_eq!(
            paris().window(Unit::Month, february + 10 * DAY),
            (february, february + 29 * DAY)
        );
    }

    #[test]
    fn year_starts_on_january_first_at_local_midnight() {
        let new_year_2024 = at(1_704_063_600); // 2024-01-01T00:00+01:00
        let new_year_2025 = at(1_735_686_000); // 2025-01-01T00:00+01:00
        assert_eq!(
            paris().window(Unit::Year, new_year_2024 + 100 * DAY),
            (new_year_2024, new_year_2025)
        );
    }

    #[test]
    fn the_last_microsecond_of_a_day_belongs_to_it() {
        let local_midnight = at(1_700_002_800);
        let (_, end) = paris().window(Unit::Day, local_midnight + DAY - 1);
        assert_eq!(end, local_midnight + DAY);
    }

    #[test]
    fn sub_day_units_fall_back_to_epoch_alignment() {
        let now = at(1_700_006_400) + 90 * SECOND_MICROS + 5;
        assert_eq!(
            paris().window(Unit::Minute, now),
            (now - 30 * SECOND_MICROS - 5, now + 30 * SECOND_MICROS - 5)
        );
    }

    #[test]
    fn instants_beyond_the_calendar_fall_back_instead_of_failing() {
        let now = u64::MAX - 1;
        let (start, end) = paris().window(Unit::Day, now);
        assert!(start <= now && now < end);
    }
}
