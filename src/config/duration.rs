//! Window lengths: integer seconds, or a number with a unit (`90s`, `1m`, `1h`, `1d`).

/// Parses `"3600"`, `"90s"`, `"1m"`, `"1h"` or `"1d"` into seconds.
/// Returns `None` for anything else (including overflow).
pub fn parse_seconds(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let factor = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return None,
    };
    n.checked_mul(factor)
}

#[cfg(test)]
mod tests {
    use super::parse_seconds;

    #[test]
    fn units() {
        assert_eq!(parse_seconds("0"), Some(0));
        assert_eq!(parse_seconds("3600"), Some(3600));
        assert_eq!(parse_seconds("90s"), Some(90));
        assert_eq!(parse_seconds("1m"), Some(60));
        assert_eq!(parse_seconds("2h"), Some(7200));
        assert_eq!(parse_seconds("1d"), Some(86_400));
        assert_eq!(parse_seconds("1w"), None);
        assert_eq!(parse_seconds("h"), None);
        assert_eq!(parse_seconds("-1"), None);
        assert_eq!(parse_seconds("1.5h"), None);
        assert_eq!(parse_seconds("99999999999999999999d"), None);
    }
}

/// Parses a duration into milliseconds: `500ms`, or anything
/// [`parse_seconds`] takes. Returns `None` for anything else.
pub fn parse_millis(text: &str) -> Option<u64> {
    let text = text.trim();
    match text.strip_suffix("ms") {
        Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => n.parse().ok(),
        Some(_) => None,
        None => parse_seconds(text)?.checked_mul(1000),
    }
}

#[cfg(test)]
mod millis_tests {
    use super::parse_millis;

    #[test]
    fn millis() {
        assert_eq!(parse_millis("500ms"), Some(500));
        assert_eq!(parse_millis("5s"), Some(5000));
        assert_eq!(parse_millis("2"), Some(2000));
        assert_eq!(parse_millis("1m"), Some(60_000));
        assert_eq!(parse_millis("ms"), None);
        assert_eq!(parse_millis("1.5s"), None);
        assert_eq!(parse_millis("-5ms"), None);
    }
}
