//! The divvy line grammar: `COMMAND [key=value ...]`, byte-compatible with
//! the original server's parser (see the README's protocol section).

use std::fmt;

/// A parsed request line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<'a> {
    /// `HIT k=v ...`: the pairs in request order, borrowed from the line (a
    /// repeated key: the last wins later).
    Hit(Vec<(&'a str, &'a str)>),
}

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
        if b == b'=' || matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r') {
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

/// Parses `key=value` pairs separated by whitespace.
fn parse_pairs(args: &str) -> Result<Vec<(&str, &str)>, LineError> {
    let mut s = js_trim(args);
    let mut pairs = Vec::new();
    while !s.is_empty() {
        let (key, rest) = read_string(s)?;
        let rest = expect_equals(rest)?;
        let (value, rest) = read_string(rest)?;
        pairs.push((key, value));
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
    Ok(pairs)
}

/// Parses one request line (without its newline).
pub fn parse_line(line: &str) -> Result<Command<'_>, LineError> {
    let (word, rest) = read_string(line)?;
    // JavaScript's toUpperCase, as the original compares; ASCII first.
    if !word.eq_ignore_ascii_case("HIT") {
        let command = word.to_uppercase();
        if command != "HIT" {
            return Err(LineError::UnknownCommand(command));
        }
    }
    Ok(Command::Hit(parse_pairs(rest)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(line: &str) -> Vec<(&str, &str)> {
        match parse_line(line) {
            Ok(Command::Hit(p)) => p,
            Err(e) => panic!("{line:?}: {e}"),
        }
    }

    fn err(line: &str) -> String {
        parse_line(line).unwrap_err().to_string()
    }

    fn pairs<'a>(list: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        list.to_vec()
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
