//! Opaque page cursors: the (created_at, id) of the last row of a page.

use crate::error::{ApiError, ApiResult};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::DateTime;
use mango_protocol::time::Timestamp;
use mango_protocol::ErrorCode;

/// The earliest instant PostgreSQL's `timestamptz` holds (4714-11-24 BC,
/// the astronomical year -4713); its latest (294276 AD) lies beyond chrono's
/// own range. A cursor outside it is not one this API issued, and would
/// fail in SQL.
static EARLIEST: std::sync::LazyLock<Timestamp> = std::sync::LazyLock::new(|| {
    chrono::NaiveDate::from_ymd_opt(-4713, 11, 24)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .expect("a date chrono holds")
        .and_utc()
});

pub fn encode(created_at: &Timestamp, id: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("v1:{}:{id}", created_at.timestamp_micros()))
}

pub fn decode(cursor: &str) -> ApiResult<(Timestamp, String)> {
    let bad = || {
        ApiError::invalid_parameter(format!("page {cursor:?} is not a cursor this API issued"))
            .code(ErrorCode::InvalidCursor)
    };
    let raw = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?;
    let text = String::from_utf8(raw).map_err(|_| bad())?;
    let mut parts = text.splitn(3, ':');
    let (Some("v1"), Some(micros), Some(id)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad());
    };
    // Ids are text, which cannot hold U+0000: no issued cursor carries one.
    if id.contains('\0') {
        return Err(bad());
    }
    let micros: i64 = micros.parse().map_err(|_| bad())?;
    let ts = DateTime::from_timestamp_micros(micros)
        .filter(|ts| *ts >= *EARLIEST)
        .ok_or_else(bad)?;
    Ok((ts, id.to_string()))
}

/// Pages are read with one row more than `limit`: if it came back, there is a
/// next page, whose cursor is made from the last row kept.
pub fn next_page<R>(
    rows: &mut Vec<R>,
    limit: i64,
    cursor_of: impl Fn(&R) -> String,
) -> Option<String> {
    if rows.len() as i64 <= limit {
        return None;
    }
    rows.truncate(limit as usize);
    rows.last().map(cursor_of)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_page_only_when_the_extra_row_came_back() {
        let mut rows = vec![1, 2, 3];
        assert_eq!(next_page(&mut rows, 3, |r| r.to_string()), None);
        assert_eq!(rows, [1, 2, 3]);
        assert_eq!(
            next_page(&mut rows, 2, |r| r.to_string()).as_deref(),
            Some("2")
        );
        assert_eq!(rows, [1, 2]);
    }

    #[test]
    fn round_trips_and_rejects_garbage() {
        let ts = mango_protocol::time::parse("2026-03-04T05:06:07.123456Z").unwrap();
        let c = encode(&ts, "work_abc");
        assert_eq!(decode(&c).unwrap(), (ts, "work_abc".to_string()));
        assert!(decode("nope!").is_err());
        assert!(decode(&URL_SAFE_NO_PAD.encode("v2:1:x")).is_err());
        assert!(decode(&URL_SAFE_NO_PAD.encode("v1:abc:x")).is_err());
        assert!(decode(&URL_SAFE_NO_PAD.encode("v1:1:x\0")).is_err());
        // The edge PostgreSQL can hold, and one microsecond before it
        // (chrono holds it; PostgreSQL would fail the statement).
        let edge = format!("v1:{}:x", EARLIEST.timestamp_micros());
        assert!(decode(&URL_SAFE_NO_PAD.encode(edge)).is_ok());
        let before = format!("v1:{}:x", EARLIEST.timestamp_micros() - 1);
        assert!(decode(&URL_SAFE_NO_PAD.encode(before)).is_err());
        // Beyond chrono's range altogether.
        let far = format!("v1:{}:x", i64::MAX);
        assert!(decode(&URL_SAFE_NO_PAD.encode(far)).is_err());
    }
}
