//! STUB — to be replaced: calendar-aligned windows in a time zone.
use super::Unit;

/// An IANA time zone for calendar-aligned fixed windows.
#[derive(Debug, Clone)]
pub struct Timezone {
    name: Box<str>,
}

impl PartialEq for Timezone {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Timezone {}

impl Timezone {
    pub fn parse(name: &str) -> Result<Self, String> {
        Ok(Timezone { name: name.into() })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The [start, end) of the calendar window of `unit` containing `now_micros`.
    pub fn window(&self, _unit: Unit, _now_micros: u64) -> (u64, u64) {
        todo!()
    }
}
