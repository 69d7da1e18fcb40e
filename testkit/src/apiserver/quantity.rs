//! `resource.Quantity` as the apiserver decodes it
//! (apimachinery/pkg/api/resource/quantity.go): a number and a suffix —
//! binary (Ki … Ei), decimal (n u m k M G T P E) or an exponent. A value
//! that does not parse fails decoding (400), not validation.

pub const FORMAT_ERROR: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// The quantity's value, or `FORMAT_ERROR`'s reason.
pub fn parse(text: &str) -> Result<f64, &'static str> {
    let split = text
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || c == '.' || ((c == '+' || c == '-') && i == 0)))
        .map_or(text.len(), |(i, _)| i);
    let (number, suffix) = text.split_at(split);
    let digits = number.trim_start_matches(['+', '-']);
    if digits.is_empty() || digits == "." || digits.matches('.').count() > 1 {
        return Err(FORMAT_ERROR);
    }
    let value: f64 = number.parse().map_err(|_| FORMAT_ERROR)?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        s if s.starts_with(['e', 'E']) => {
            let exponent: i32 = s[1..].parse().map_err(|_| FORMAT_ERROR)?;
            10f64.powi(exponent)
        }
        _ => return Err(FORMAT_ERROR),
    };
    Ok(value * scale)
}

/// A quantity as JSON: a string, or a number.
pub fn of_json(value: &serde_json::Value) -> Result<f64, &'static str> {
    match value {
        serde_json::Value::String(s) => parse(s),
        serde_json::Value::Number(n) => n.as_f64().ok_or(FORMAT_ERROR),
        _ => Err(FORMAT_ERROR),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse("100m"), Ok(0.1));
        assert_eq!(parse("1Gi"), Ok(1073741824.0));
        assert_eq!(parse("1e3"), Ok(1000.0));
        assert_eq!(parse("-1"), Ok(-1.0));
        for bad in ["", "1Gb", "abc", "1..0", "Mi", "1 Gi"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
