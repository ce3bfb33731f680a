//! The divvy line grammar: `COMMAND [key=value ...]`, byte-compatible with
//! the original server's parser (see the README's protocol section).

use std::fmt;

/// Why a line was refused; [`fmt::Display`] gives the exact `ERR` line (without newline).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineError {
    /// `ERR unknown-command "Unrecognized command: <WORD>"`.
    UnknownCommand(String),
    /// `ERR unknown "<message>"`: a malformed line.
    Malformed(String),
}

impl LineError {
    /// The error code on the `ERR` line.
    pub fn code(&self) -> &'static str {
        match self {
            LineError::UnknownCommand(_) => "unknown-command",
            LineError::Malformed(_) => "unknown",
        }
    }
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineError::UnknownCommand(word) => {
                write!(f, "ERR {} \"Unrecognized command: {word}\"", self.code())
            }
            LineError::Malformed(message) => write!(f, "ERR {} \"{message}\"", self.code()),
        }
    }
}

/// JavaScript's `\s`: the whitespace set the original server splits on.
pub fn is_js_whitespace(c: char) -> bool {
    matches!(
        c,
        ' ' | '\t' | '\n' | '\u{0B}' | '\u{0C}' | '\r' | '\u{A0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200A}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202F}'
                | '\u{205F}'
                | '\u{3000}'
                | '\u{FEFF}'
    )
}

fn js_trim(s: &str) -> &str {
    s.trim_matches(is_js_whitespace)
}

/// Reads a quoted (`"..."`, no escapes) or unquoted (up to whitespace or `=`)
/// string from the start of `s`; returns it and the rest.
fn read_string(s: &str) -> Result<(&str, &str), LineError> {
    if let Some(inner) = s.strip_prefix('"') {
        return match inner.find('"') {
            Some(end) => Ok((&inner[..end], &inner[end + 1..])),
            None => Err(LineError::Malformed(
                "Unexpected end of quoted string.".to_owned(),
            )),
        };
    }
    // Bytes first (requests are ASCII); from the first non-ASCII byte on,
    // chars, for JavaScript's non-ASCII whitespace.
    let mut end = s.len();
    for (i, &b) in s.as_bytes().iter().enumerate() {
        if b >= 0x80 {
            end = i + s[i..]
                .find(|c: char| c == '=' || is_js_whitespace(c))
                .unwrap_or(s.len() - i);
            break;
        }
        // `=` or ASCII whitespace: the fast parser's byte classes.
        if CLASS[usize::from(b)] != OTHER {
            end = i;
            break;
        }
    }
    Ok((&s[..end], &s[end..]))
}

/// How the original names a character in an error: one UTF-16 unit, so a
/// character outside the Basic Multilingual Plane shows as U+FFFD.
fn js_char(c: char) -> char {
    if (c as u32) > 0xFFFF {
        char::REPLACEMENT_CHARACTER
    } else {
        c
    }
}

fn expect_equals(s: &str) -> Result<&str, LineError> {
    match s.chars().next() {
        None => Err(LineError::Malformed(
            "Unexpected end of input string.".to_owned(),
        )),
        Some('=') => Ok(&s[1..]),
        Some(c) => Err(LineError::Malformed(format!(
            "Expected '=', found '{}'",
            js_char(c)
        ))),
    }
}

/// Parses `key=value` pairs separated by whitespace, handing each to `pair`
/// in request order.
fn parse_pairs<'a>(
    args: &'a str,
    pair: &mut impl FnMut(&'a str, &'a str),
) -> Result<(), LineError> {
    let mut s = js_trim(args);
    while !s.is_empty() {
        let (key, rest) = read_string(s)?;
        let rest = expect_equals(rest)?;
        let (value, rest) = read_string(rest)?;
        pair(key, value);
        s = rest;
        if let Some(c) = s.chars().next() {
            if !is_js_whitespace(c) {
                return Err(LineError::Malformed(format!(
                    "Expected whitespace, found '{}'",
                    js_char(c)
                )));
            }
            s = s.trim_start_matches(is_js_whitespace);
        }
    }
    Ok(())
}

/// Parses one request line (without its newline), a HIT, handing its pairs
/// (borrowed from the line) to `pair` in request order, a repeated key as
/// often as it comes. On an error some pairs may have been handed over
/// already; the caller drops them.
pub fn parse_hit<'a>(line: &'a str, pair: impl FnMut(&'a str, &'a str)) -> Result<(), LineError> {
    let plain = plain_text(line.as_bytes()).is_some();
    parse_text(line, plain, pair)
}

/// [`parse_hit`] for a line whose plainness is known: `plain` says that
/// [`plain_text`] took it (ASCII without quotes). A line wrongly said to be
/// plain would be parsed as if it were (a quote kept as a character,
/// non-ASCII whitespace kept in a word), so this is for this crate only.
pub(crate) fn parse_text<'a>(
    line: &'a str,
    plain: bool,
    mut pair: impl FnMut(&'a str, &'a str),
) -> Result<(), LineError> {
    debug_assert_eq!(plain, plain_text(line.as_bytes()).is_some());
    // Most lines are ASCII without quotes: one pass of the fast parser over
    // their bytes. Any other line, and any malformed one (for its exact
    // error), goes through the general parser, which the fast one mirrors.
    if plain && parse_plain(line, &mut pair).is_some() {
        return Ok(());
    }
    parse_general(line, &mut pair)
}

/// A line's bytes as text when they are what the fast parser takes, ASCII
/// without quotes; `None` otherwise. One pass with no early exit, which
/// the compiler vectorises, far cheaper than three passes (`is_ascii`, a
/// search for `"`, `str::from_utf8`; docs/performance.md, "The line
/// protocol path").
pub fn plain_text(line: &[u8]) -> Option<&str> {
    let seen = line
        .iter()
        .fold(0u8, |seen, &b| seen | (b & 0x80) | u8::from(b == b'"'));
    if seen != 0 {
        return None;
    }
    // SAFETY: no byte has its high bit set: every byte is ASCII, and ASCII
    // bytes are valid UTF-8 on their own.
    Some(unsafe { std::str::from_utf8_unchecked(line) })
}

/// [`parse_hit`] for any line, the original server's grammar step by step.
fn parse_general<'a>(
    line: &'a str,
    pair: &mut impl FnMut(&'a str, &'a str),
) -> Result<(), LineError> {
    let (word, rest) = read_string(line)?;
    // JavaScript's toUpperCase, as the original compares; ASCII first.
    if !word.eq_ignore_ascii_case("HIT") {
        let command = word.to_uppercase();
        if command != "HIT" {
            return Err(LineError::UnknownCommand(command));
        }
    }
    parse_pairs(rest, pair)
}

/// How [`parse_plain`] sees a byte: part of a word.
const OTHER: u8 = 0;
/// Whitespace: the ASCII bytes of JavaScript's `\s`.
const SPACE: u8 = 1;
/// `=`.
const EQUALS: u8 = 2;

/// [`OTHER`], [`SPACE`] (the ASCII bytes of JavaScript's `\s`) or [`EQUALS`], by byte.
static CLASS: [u8; 256] = {
    let mut class = [OTHER; 256];
    class[b' ' as usize] = SPACE;
    class[b'\t' as usize] = SPACE;
    class[b'\n' as usize] = SPACE;
    class[0x0B] = SPACE;
    class[0x0C] = SPACE;
    class[b'\r' as usize] = SPACE;
    class[b'=' as usize] = EQUALS;
    class
};

/// The general parser's steps for a line of ASCII without quotes, on its
/// bytes: `None` (and perhaps some pairs handed over) where that parser
/// would answer an error.
fn parse_plain<'a>(line: &'a str, pair: &mut impl FnMut(&'a str, &'a str)) -> Option<()> {
    let b = line.as_bytes();
    // The end of the run of bytes of class `class` from `from`, before `end`.
    let run = |from: usize, end: usize, class: u8| {
        b.get(from..end)
            .and_then(|s| s.iter().position(|&c| CLASS[usize::from(c)] != class))
            .map_or(end, |n| from + n)
    };
    let class = |i: usize| b.get(i).map(|&c| CLASS[usize::from(c)]);
    // The command: up to whitespace or `=`.
    let mut i = run(0, b.len(), OTHER);
    if !line.get(..i)?.eq_ignore_ascii_case("HIT") {
        return None;
    }
    // The rest, trimmed at both ends.
    let mut end = b.len();
    while end > i && class(end - 1) == Some(SPACE) {
        end -= 1;
    }
    i = run(i, end, SPACE);
    while i < end {
        let key = i;
        i = run(i, end, OTHER);
        if i == end || class(i) != Some(EQUALS) {
            return None;
        }
        let key_end = i;
        let value = i + 1;
        i = run(value, end, OTHER);
        pair(line.get(key..key_end)?, line.get(value..i)?);
        if i < end {
            if class(i) != Some(SPACE) {
                return None;
            }
            i = run(i, end, SPACE);
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(line: &str) -> Vec<(&str, &str)> {
        run(line, |l, p| parse_hit(l, p)).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }

    fn err(line: &str) -> String {
        run(line, |l, p| parse_hit(l, p)).unwrap_err()
    }

    fn pairs<'a>(list: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        list.to_vec()
    }

    /// What `parse` makes of `line`: the pairs in order, or the error line.
    fn run<'a>(
        line: &'a str,
        parse: impl FnOnce(&'a str, &mut dyn FnMut(&'a str, &'a str)) -> Result<(), LineError>,
    ) -> Result<Vec<(&'a str, &'a str)>, String> {
        let mut pairs = Vec::new();
        parse(line, &mut |k, v| pairs.push((k, v)))
            .map(|()| pairs)
            .map_err(|e| e.to_string())
    }

    proptest::proptest! {
        /// The fast path answers every line exactly as the general parser
        /// does: the same pairs in the same order, or the same error.
        #[test]
        fn the_fast_path_answers_as_the_general_parser(
            line in "(HIT |hit\\t|HiT|HITS |H |hıt |\"HIT\" | HIT |HIT=)?\
                     ([ab]{0,2}(=[ab]{0,2})?[ \t\x0B\r\"=é\u{A0}\u{3000}😀]{0,2}){0,5}",
        ) {
            let fast = run(&line, |l, p| parse_hit(l, p));
            let general = run(&line, |l, mut p| parse_general(l, &mut p));
            proptest::prop_assert_eq!(fast, general);
        }

        /// On lines of printable ASCII and ASCII whitespace without quotes
        /// (the lines it is for), the fast path takes exactly the lines the
        /// general parser accepts, with the same pairs.
        #[test]
        fn the_fast_path_takes_every_plain_line_the_general_parser_accepts(
            line in "(HIT |hit\\t|HIT\\x0C|HIT=)?\
                     ([ab]{0,2}(=[ab]{0,2})?[ \t\n\x0B\x0C\r\x1C\x1F=!~]{0,2}){0,5}",
        ) {
            let mut plain = Vec::new();
            let taken = parse_plain(&line, &mut |k, v| plain.push((k, v)));
            let general = run(&line, |l, mut p| parse_general(l, &mut p));
            proptest::prop_assert_eq!(taken.is_some(), general.is_ok());
            if let Ok(pairs) = general {
                proptest::prop_assert_eq!(plain, pairs);
            }
        }
    }

    #[test]
    fn plain_text_is_ascii_without_quotes() {
        assert_eq!(plain_text(b"HIT a=b\t c=d\r"), Some("HIT a=b\t c=d\r"));
        assert_eq!(plain_text(b""), Some(""));
        // Every ASCII byte but the quote, wherever it falls in the vector.
        let all: Vec<u8> = (0u8..0x80).filter(|&b| b != b'"').collect();
        for at in 0..all.len() {
            assert_eq!(plain_text(&all[at..]).map(str::as_bytes), Some(&all[at..]));
            let mut quoted = all.clone();
            quoted[at] = b'"';
            assert_eq!(plain_text(&quoted), None, "a quote at {at}");
            let mut high = all.clone();
            high[at] = 0x80 | all[at];
            assert_eq!(plain_text(&high), None, "a high byte at {at}");
        }
        assert_eq!(plain_text("HIT a=\u{e9}".as_bytes()), None);
    }

    #[test]
    fn the_fast_path_takes_plain_lines() {
        let mut pairs = Vec::new();
        let taken = parse_plain(" HIT  a=1\t b= =c  \r", &mut |k, v| pairs.push((k, v)));
        assert_eq!(taken, None, "a leading space is an unknown command");
        let taken = parse_plain("hit  a=1\t b= =c  \x0B", &mut |k, v| pairs.push((k, v)));
        assert_eq!(taken, Some(()));
        assert_eq!(pairs, [("a", "1"), ("b", ""), ("", "c")]);
    }

    #[test]
    fn grammar() {
        assert_eq!(ok("HIT"), pairs(&[]));
        assert_eq!(ok("hit a=b"), pairs(&[("a", "b")]));
        assert_eq!(ok("\"HiT\" a=b"), pairs(&[("a", "b")]));
        assert_eq!(
            ok("HIT a=\"b c\"  \t d=\"\""),
            pairs(&[("a", "b c"), ("d", "")])
        );
        assert_eq!(ok("HIT a= =x"), pairs(&[("a", ""), ("", "x")]));
        assert_eq!(ok("HIT x\"y=1"), pairs(&[("x\"y", "1")]));
        assert_eq!(
            ok("HIT a=1\u{A0}b=2\u{3000}"),
            pairs(&[("a", "1"), ("b", "2")])
        );
        // Non-ASCII bytes before JavaScript whitespace (the byte scan hands over to chars).
        assert_eq!(
            ok("HIT é=aé\u{2003}b=\u{1680}"),
            pairs(&[("é", "aé"), ("b", "")])
        );
        // toUpperCase maps the dotless ı to I.
        assert_eq!(ok("hıt a=b"), pairs(&[("a", "b")]));
        assert_eq!(ok("HIT=x"), pairs(&[("", "x")]));
        assert_eq!(ok("HIT \"k k\"=\"v=v\""), pairs(&[("k k", "v=v")]));
    }

    #[test]
    fn errors_are_byte_exact() {
        assert_eq!(err(""), "ERR unknown-command \"Unrecognized command: \"");
        assert_eq!(
            err(" HIT a=b"),
            "ERR unknown-command \"Unrecognized command: \""
        );
        assert_eq!(
            err("get a=b"),
            "ERR unknown-command \"Unrecognized command: GET\""
        );
        assert_eq!(
            err("HIT a=\"b"),
            "ERR unknown \"Unexpected end of quoted string.\""
        );
        assert_eq!(
            err("\"HIT"),
            "ERR unknown \"Unexpected end of quoted string.\""
        );
        assert_eq!(
            err("HIT a"),
            "ERR unknown \"Unexpected end of input string.\""
        );
        assert_eq!(err("HIT a b"), "ERR unknown \"Expected '=', found ' '\"");
        assert_eq!(
            err("HIT \"a\"b=c"),
            "ERR unknown \"Expected '=', found 'b'\""
        );
        assert_eq!(
            err("HIT a=b=c"),
            "ERR unknown \"Expected whitespace, found '='\""
        );
        assert_eq!(
            err("HIT a=\"b\"c"),
            "ERR unknown \"Expected whitespace, found 'c'\""
        );
        assert_eq!(
            err("HIT a=\"b\"😀"),
            "ERR unknown \"Expected whitespace, found '\u{FFFD}'\""
        );
    }
}
