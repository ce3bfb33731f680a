//! Anchored glob patterns for rule values.
//!
//! A value is matched as a whole (anchored at both ends). `*` matches any run of
//! characters, including none; every `*` in a value is a wildcard. A value that
//! is exactly `*` means "the key is present, with any value". There is no
//! escape and no other metacharacter: divvy rules only ever had `*`, so a
//! general glob crate (with `?`, `[...]` and `{a,b}`) would change the meaning
//! of existing configs.

use std::fmt;

/// A compiled rule value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// The value must equal this string.
    Exact(String),
    /// `*`: the key must be present; any value matches.
    Any,
    /// A value with at least one `*` that is not just `*`.
    Glob(Glob),
}

/// A glob split at its `*`s: `prefix*mid*...*suffix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    source: String,
    /// The literal pieces between stars; there are `stars + 1` of them.
    pieces: Vec<String>,
}

impl Pattern {
    /// Compiles a rule value.
    pub fn new(value: &str) -> Pattern {
        if value == "*" {
            Pattern::Any
        } else if value.contains('*') {
            Pattern::Glob(Glob {
                source: value.to_owned(),
                pieces: value.split('*').map(str::to_owned).collect(),
            })
        } else {
            Pattern::Exact(value.to_owned())
        }
    }

    /// The value as written in the config.
    pub fn as_str(&self) -> &str {
        match self {
            Pattern::Exact(s) => s,
            Pattern::Any => "*",
            Pattern::Glob(g) => &g.source,
        }
    }

    /// Whether `value` matches this pattern.
    pub fn matches(&self, value: &str) -> bool {
        match self {
            Pattern::Exact(s) => short_eq(s.as_bytes(), value.as_bytes()),
            Pattern::Any => true,
            Pattern::Glob(g) => g.matches(value),
        }
    }

    /// Whether every value that `other` matches is also matched by `self`.
    ///
    /// Sound but not complete: `true` is only returned when the inclusion
    /// really holds; some exotic inclusions between two globs may be missed.
    pub fn covers(&self, other: &Pattern) -> bool {
        match (self, other) {
            (Pattern::Any, _) => true,
            (_, Pattern::Any) => false,
            (p, Pattern::Exact(v)) => p.matches(v),
            (Pattern::Exact(_), Pattern::Glob(_)) => false,
            (Pattern::Glob(a), Pattern::Glob(b)) => a.covers_glob(b),
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `a == b` for slices of equal length, compared in place: rule values are
/// short, and a call to the C library's `memcmp` costs more than the loop.
#[inline]
pub(crate) fn short_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// One symbol of a glob being tested for inclusion: a literal char, or a star
/// of the covered glob (which only a star of the covering glob may absorb).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sym {
    Char(char),
    Star,
}

impl Glob {
    /// Matches on bytes: literal pieces are valid UTF-8, so every place a
    /// piece is found starts on a char boundary. No allocation.
    fn matches(&self, value: &str) -> bool {
        let first = &self.pieces[0];
        let last = &self.pieces[self.pieces.len() - 1];
        let v = value.as_bytes();
        if v.len() < first.len() + last.len()
            || !short_eq(&v[..first.len()], first.as_bytes())
            || !short_eq(&v[v.len() - last.len()..], last.as_bytes())
        {
            return false;
        }
        let mut rest = &value[first.len()..value.len() - last.len()];
        for piece in &self.pieces[1..self.pieces.len() - 1] {
            match rest.find(piece.as_str()) {
                Some(at) => rest = &rest[at + piece.len()..],
                None => return false,
            }
        }
        true
    }

    /// `self` covers `other` if `self` matches `other`'s source where each of
    /// `other`'s stars is an opaque symbol that only one of `self`'s stars can
    /// consume. Any string `other` matches is then matched by `self`, because
    /// the star that absorbed the symbol absorbs whatever it stands for.
    fn covers_glob(&self, other: &Glob) -> bool {
        let mut syms = Vec::new();
        for (i, piece) in other.pieces.iter().enumerate() {
            if i > 0 {
                syms.push(Sym::Star);
            }
            syms.extend(piece.chars().map(Sym::Char));
        }
        self.matches_syms(&syms)
    }

    /// Classic greedy wildcard matching with single backtracking point,
    /// linear in practice and never exponential.
    fn matches_syms(&self, input: &[Sym]) -> bool {
        let first = &self.pieces[0];
        let last = &self.pieces[self.pieces.len() - 1];
        let pre: Vec<char> = first.chars().collect();
        let post: Vec<char> = last.chars().collect();
        if input.len() < pre.len() + post.len() {
            return false;
        }
        let lit_eq = |lits: &[char], syms: &[Sym]| {
            lits.iter()
                .zip(syms.iter())
                .all(|(c, s)| *s == Sym::Char(*c))
        };
        if !lit_eq(&pre, &input[..pre.len()]) || !lit_eq(&post, &input[input.len() - post.len()..])
        {
            return false;
        }
        // Middle pieces must appear in order, each as early as possible
        // (leftmost-first is optimal for `*`-only globs).
        let mut rest = &input[pre.len()..input.len() - post.len()];
        for piece in &self.pieces[1..self.pieces.len() - 1] {
            let lits: Vec<char> = piece.chars().collect();
            if lits.is_empty() {
                continue;
            }
            match rest.windows(lits.len()).position(|w| lit_eq(&lits, w)) {
                Some(at) => rest = &rest[at + lits.len()..],
                None => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, v: &str) -> bool {
        Pattern::new(p).matches(v)
    }

    #[test]
    fn exact_and_any() {
        assert!(m("GET", "GET"));
        assert!(!m("GET", "get"));
        assert!(!m("GET", "GETX"));
        assert!(m("*", ""));
        assert!(m("*", "anything"));
        assert!(m("", ""));
        assert!(!m("", "x"));
    }

    #[test]
    fn globs_are_anchored_and_every_star_counts() {
        assert!(m("/a/*", "/a/"));
        assert!(m("/a/*", "/a/b/c"));
        assert!(!m("/a/*", "/b/a/"));
        assert!(m("/a/*/c", "/a/b/c"));
        assert!(m("/a/*/c", "/a/b/x/c"));
        assert!(!m("/a/*/c", "/a/b/cdef"));
        assert!(m("*.png", "x.png"));
        assert!(!m("*.png", "x.png.gz"));
        assert!(m("a**", "a"));
        assert!(m("a**b", "ab"));
        assert!(m("*a*b*", "xxaxxbxx"));
        assert!(!m("*a*b*", "xxbxxaxx"));
        assert!(!m("ab*ba", "aba"));
        assert!(m("ab*ba", "abba"));
        assert!(m("é*ü", "éaü"));
    }

    #[test]
    fn coverage_is_sound() {
        let c = |a: &str, b: &str| Pattern::new(a).covers(&Pattern::new(b));
        assert!(c("*", "/x"));
        assert!(c("*", "/x/*"));
        assert!(c("/x/*", "/x/y"));
        assert!(c("/x/*", "/x/y/*"));
        assert!(c("/x/*", "/x/*"));
        assert!(c("*.png", "/img/*.png"));
        assert!(c("/a/*/c", "/a/b/*/c"));
        assert!(!c("/x/y/*", "/x/*"));
        assert!(!c("/x/y", "/x/*"));
        assert!(!c("/x/*", "*"));
        assert!(!c("/x/*", "/y"));
        assert!(!c("a*b", "a*"));
        assert!(c("a*", "a*b"));
    }
}
