//! Timestamps on the wire: RFC 3339, UTC, `Z`, exactly six fractional digits.
//!
//! One fixed format matters because heartbeats echo `last_heartbeat` byte for
//! byte and the server compares the parsed value with what it stored; PostgreSQL
//! keeps microseconds, so a microsecond string round-trips exactly.

use chrono::{DateTime, SecondsFormat, Timelike, Utc};

pub type Timestamp = DateTime<Utc>;

/// Formats a timestamp the one way Mango ever writes it.
pub fn format(ts: &Timestamp) -> String {
    ts.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Parses any RFC 3339 timestamp (clients may echo other offsets) into UTC.
pub fn parse(s: &str) -> Option<Timestamp> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// Drops sub-microsecond precision so a value equals what PostgreSQL stores.
pub fn truncate_micros(ts: Timestamp) -> Timestamp {
    let nanos = ts.nanosecond();
    ts.with_nanosecond(nanos - nanos % 1_000).unwrap_or(ts)
}

/// `Utc::now()` at the precision the store keeps.
pub fn now() -> Timestamp {
    truncate_micros(Utc::now())
}

/// serde helpers for `Timestamp` and `Option<Timestamp>` in the fixed format.
pub mod serde_ts {
    use super::*;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(ts: &Timestamp, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(ts))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Timestamp, D::Error> {
        let raw = String::deserialize(d)?;
        parse(&raw)
            .ok_or_else(|| serde::de::Error::custom(format!("not an RFC 3339 timestamp: {raw}")))
    }

    pub mod option {
        use super::*;
        pub fn serialize<S: Serializer>(ts: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
            match ts {
                Some(t) => s.serialize_str(&format(t)),
                None => s.serialize_none(),
            }
        }
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
            match Option::<String>::deserialize(d)? {
                None => Ok(None),
                Some(raw) => parse(&raw).map(Some).ok_or_else(|| {
                    serde::de::Error::custom(format!("not an RFC 3339 timestamp: {raw}"))
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_is_fixed_width_utc_and_round_trips() {
        let t = parse("2026-01-02T03:04:05.1+02:00").unwrap();
        let s = format(&t);
        assert_eq!(s, "2026-01-02T01:04:05.100000Z");
        assert_eq!(parse(&s), Some(t));
    }

    #[test]
    fn truncation_matches_store_precision() {
        let t = parse("2026-01-02T03:04:05.123456789Z").unwrap();
        assert_eq!(format(&truncate_micros(t)), "2026-01-02T03:04:05.123456Z");
    }
}
