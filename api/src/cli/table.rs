//! What people read: aligned columns, human ages, one-line cells.

use mango_protocol::time::Timestamp;

/// A table of text cells under a header, printed with each column as wide
/// as its widest cell and two spaces between columns.
pub struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&'static str]) -> Table {
        Table {
            header: header.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; a cell is cut to its first line so a row stays one line.
    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.header.len(), "a cell per column");
        self.rows
            .push(cells.into_iter().map(|c| first_line(&c)).collect());
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &mut dyn Iterator<Item = &str>| {
            let parts: Vec<String> = cells
                .zip(&widths)
                .map(|(c, w)| {
                    let pad = w - c.chars().count();
                    format!("{c}{}", " ".repeat(pad))
                })
                .collect();
            let mut text = parts.join("  ").trim_end().to_string();
            text.push('\n');
            text
        };
        let mut out = line(&mut self.header.iter().copied());
        for row in &self.rows {
            out.push_str(&line(&mut row.iter().map(String::as_str)));
        }
        out
    }
}

/// The first line of `text`, without control characters, so a cell or an
/// error message cannot break the line it is part of.
pub fn first_line(text: &str) -> String {
    let line = text.trim_start().lines().next().unwrap_or("");
    line.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim_end()
        .to_string()
}

/// `text`'s first line, at most `max` characters, ending in `…` when cut.
pub fn short(text: &str, max: usize) -> String {
    let line = first_line(text);
    if line.chars().count() <= max {
        return line;
    }
    let mut cut: String = line.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// A span of seconds as people say it: `5s`, `3m`, `2h`, `4d`; negative
/// spans (a clock ahead of ours) count as `0s`.
pub fn span(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// How long ago `at` was, as of `now`.
pub fn age(at: Timestamp, now: Timestamp) -> String {
    span((now - at).num_seconds())
}

/// [`age`] of an optional time, `-` when there is none.
pub fn age_or_dash(at: Option<Timestamp>, now: Timestamp) -> String {
    at.map_or_else(|| "-".to_string(), |t| age(t, now))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let mut t = Table::new(&["ID", "STATE"]);
        t.row(vec!["work_1".into(), "queued".into()]);
        t.row(vec!["w".into(), "stopped\nsecond line".into()]);
        assert_eq!(
            t.render(),
            "ID      STATE\nwork_1  queued\nw       stopped\n"
        );
    }

    #[test]
    fn wide_characters_count_once() {
        let mut t = Table::new(&["A", "B"]);
        t.row(vec!["é…".into(), "x".into()]);
        assert_eq!(t.render(), "A   B\né…  x\n");
    }

    #[test]
    fn spans_read_as_people_say_them() {
        for (secs, text) in [
            (-3, "0s"),
            (0, "0s"),
            (59, "59s"),
            (60, "1m"),
            (3599, "59m"),
            (3600, "1h"),
            (86399, "23h"),
            (86400, "1d"),
            (10 * 86400, "10d"),
        ] {
            assert_eq!(span(secs), text, "{secs}");
        }
    }

    #[test]
    fn short_cuts_at_its_limit_and_keeps_one_line() {
        assert_eq!(short("abc", 3), "abc");
        assert_eq!(short("abcd", 3), "ab…");
        assert_eq!(short("  one\ntwo", 10), "one");
        assert_eq!(short("tab\there", 20), "tab here");
    }
}
