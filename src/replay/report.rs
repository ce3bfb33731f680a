//! What a replay found: per rule, each policy's allowed, denied and shadow
//! (would have denied, allowed) hits; the requests whose decision changed;
//! the lines skipped as malformed. Its `Display` is what `divvy replay` prints.

use std::collections::HashMap;
use std::fmt;

/// What a policy did with one descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Allowed.
    Allowed,
    /// Denied.
    Denied,
    /// Allowed by a shadow rule that would have denied it.
    Shadow,
}

impl Fate {
    fn as_str(self) -> &'static str {
        match self {
            Fate::Allowed => "allowed",
            Fate::Denied => "denied",
            Fate::Shadow => "allowed (shadow would deny)",
        }
    }
}

/// One policy's counts for one rule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Hits allowed (shadow ones included).
    pub allowed: u64,
    /// Hits denied.
    pub denied: u64,
    /// Of the allowed, those a shadow rule would have denied.
    pub shadow: u64,
}

impl Counts {
    fn add(&mut self, fate: Fate) {
        match fate {
            Fate::Allowed => self.allowed += 1,
            Fate::Denied => self.denied += 1,
            Fate::Shadow => {
                self.allowed += 1;
                self.shadow += 1;
            }
        }
    }
}

/// A request the two policies decided differently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Its line in the traffic (from 1).
    pub line: usize,
    /// The line as recorded.
    pub request: String,
    /// Under the old policy: its rules and fates, one per descriptor.
    pub old: String,
    /// Under the new policy.
    pub new: String,
}

/// The replay's findings.
#[derive(Debug, Default)]
pub struct Report {
    /// Whether an old policy ran beside the new one.
    pub compared: bool,
    /// Requests replayed (lines that parsed).
    pub requests: u64,
    /// First and last recorded times seen (ms since the epoch).
    pub span_ms: Option<(u64, u64)>,
    /// Rule names in order of first decision.
    pub order: Vec<String>,
    /// Per rule name: counts under the new policy and under the old.
    pub rules: HashMap<String, (Counts, Counts)>,
    /// Requests whose decision changed.
    pub changed: u64,
    /// The first of them.
    pub examples: Vec<Change>,
    /// Malformed lines skipped.
    pub skipped: u64,
    /// The first of them: line number and why.
    pub skipped_examples: Vec<(usize, String)>,
    keep: usize,
}

impl Report {
    /// An empty report keeping `keep` examples of each kind.
    pub fn new(compared: bool, keep: usize) -> Report {
        Report {
            compared,
            keep,
            ..Report::default()
        }
    }

    /// Counts a malformed line, skipped.
    pub fn malformed(&mut self, line: usize, why: String) {
        self.skipped += 1;
        if self.skipped_examples.len() < self.keep {
            self.skipped_examples.push((line, why));
        }
    }

    /// Counts one request's fates under the new policy (and the old).
    pub fn add(
        &mut self,
        line: usize,
        text: &str,
        at_ms: Option<u64>,
        new: &[(String, Fate)],
        old: Option<&[(String, Fate)]>,
    ) {
        self.requests += 1;
        if let Some(t) = at_ms {
            let (first, last) = self.span_ms.get_or_insert((t, t));
            *first = (*first).min(t);
            *last = (*last).max(t);
        }
        for (name, fate) in new {
            self.entry(name).0.add(*fate);
        }
        let Some(old) = old else {
            return;
        };
        for (name, fate) in old {
            self.entry(name).1.add(*fate);
        }
        let denied = |fates: &[(String, Fate)]| fates.iter().any(|(_, f)| *f == Fate::Denied);
        if denied(new) != denied(old) {
            self.changed += 1;
            if self.examples.len() < self.keep {
                self.examples.push(Change {
                    line,
                    request: text.to_owned(),
                    old: describe(old),
                    new: describe(new),
                });
            }
        }
    }

    fn entry(&mut self, name: &str) -> &mut (Counts, Counts) {
        if !self.rules.contains_key(name) {
            self.order.push(name.to_owned());
        }
        self.rules.entry(name.to_owned()).or_default()
    }

    /// Totals of every rule: (new, old).
    pub fn totals(&self) -> (Counts, Counts) {
        let mut total = (Counts::default(), Counts::default());
        for (n, o) in self.rules.values() {
            for (t, c) in [(&mut total.0, n), (&mut total.1, o)] {
                t.allowed += c.allowed;
                t.denied += c.denied;
                t.shadow += c.shadow;
            }
        }
        total
    }
}

/// `denied by <rule>` (or allowed) for each descriptor of a request.
fn describe(fates: &[(String, Fate)]) -> String {
    let parts: Vec<String> = fates
        .iter()
        .map(|(name, f)| format!("{} by {name}", f.as_str()))
        .collect();
    parts.join("; ")
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let span = self.span_ms.map_or(0.0, |(a, b)| (b - a) as f64 / 1000.0);
        writeln!(
            f,
            "replayed {} requests over {span:.1} s of recorded time; {} malformed lines skipped",
            self.requests, self.skipped
        )?;
        let width = self.order.iter().map(String::len).max().unwrap_or(0).max(5);
        write!(
            f,
            "{:<width$}  {:>10} {:>10} {:>10}",
            "rule", "allowed", "denied", "shadow"
        )?;
        if self.compared {
            write!(
                f,
                "  {:>11} {:>11} {:>11}",
                "old allowed", "old denied", "old shadow"
            )?;
        }
        writeln!(f)?;
        let row = |f: &mut fmt::Formatter<'_>, name: &str, (n, o): (Counts, Counts)| {
            write!(
                f,
                "{name:<width$}  {:>10} {:>10} {:>10}",
                n.allowed, n.denied, n.shadow
            )?;
            if self.compared {
                write!(f, "  {:>11} {:>11} {:>11}", o.allowed, o.denied, o.shadow)?;
            }
            writeln!(f)
        };
        for name in &self.order {
            row(f, name, self.rules.get(name).copied().unwrap_or_default())?;
        }
        row(f, "total", self.totals())?;
        if self.compared {
            writeln!(f, "changed decisions: {}", self.changed)?;
            for c in &self.examples {
                writeln!(
                    f,
                    "  line {}: {}\n    old: {}\n    new: {}",
                    c.line, c.request, c.old, c.new
                )?;
            }
        }
        for (line, why) in &self.skipped_examples {
            writeln!(f, "skipped line {line}: {why}")?;
        }
        Ok(())
    }
}
