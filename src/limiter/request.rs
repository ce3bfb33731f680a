//! What a caller asks the limiter: one request type for every protocol.

use crate::config::envoy_ratelimit::EnvoyUnit;
use crate::rules::Operation;

/// A limit that replaces the deciding rule's own (Envoy's `RateLimitOverride`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Credits per window.
    pub credit_limit: u64,
    /// Window in seconds.
    pub reset_seconds: u64,
}

/// One descriptor of a request as divvy rules read it: its pairs (a
/// repeated key: the last wins) and what it asks besides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// The key/value pairs.
    pub operation: Operation,
    /// Credits to take; 0 checks without consuming.
    pub cost: u64,
    /// Give the credits back instead of taking them.
    pub refund: bool,
    /// A limit to use instead of the deciding rule's.
    pub limit_override: Option<LimitOverride>,
}

impl Hit {
    /// A hit of one credit with no override.
    pub fn one(operation: Operation) -> Hit {
        Hit {
            operation,
            cost: 1,
            refund: false,
            limit_override: None,
        }
    }
}

/// A descriptor's entries, in request order: up to [`Entries::INLINE`]
/// held in place (most descriptors carry one to three), more in a `Vec`.
/// Unlike `SmallVec`, it keeps a descriptor covariant in its lifetime, so
/// a request can borrow descriptors that live on the caller's stack.
#[derive(Debug, Clone)]
pub enum Entries<'a> {
    /// Up to `INLINE` entries; the count is the second field.
    Inline([(&'a str, &'a str); Entries::INLINE], u8),
    /// More.
    Heap(Vec<(&'a str, &'a str)>),
}

impl Entries<'_> {
    /// Entries held in place.
    pub const INLINE: usize = 4;
}

impl<'a> std::ops::Deref for Entries<'a> {
    type Target = [(&'a str, &'a str)];

    fn deref(&self) -> &Self::Target {
        match self {
            Entries::Inline(items, n) => &items[..usize::from(*n)],
            Entries::Heap(v) => v,
        }
    }
}

impl<'a> FromIterator<(&'a str, &'a str)> for Entries<'a> {
    fn from_iter<I: IntoIterator<Item = (&'a str, &'a str)>>(iter: I) -> Self {
        let mut items = [("", ""); Entries::INLINE];
        let mut iter = iter.into_iter();
        for (n, slot) in items.iter_mut().enumerate() {
            match iter.next() {
                Some(e) => *slot = e,
                None => return Entries::Inline(items, n as u8),
            }
        }
        match iter.next() {
            None => Entries::Inline(items, Entries::INLINE as u8),
            Some(e) => {
                let mut v = items.to_vec();
                v.push(e);
                v.extend(iter);
                Entries::Heap(v)
            }
        }
    }
}

/// One descriptor of a domain's request, in no protocol's shape: its
/// entries in order, borrowed from the request, and what it asks besides.
#[derive(Debug, Clone)]
pub struct Descriptor<'a> {
    /// Key/value entries in request order (a repeated key: the last wins
    /// for divvy rules; envoyproxy/ratelimit trees walk them in order).
    pub entries: Entries<'a>,
    /// Hits to add; 0 checks without consuming.
    pub cost: u64,
    /// Give `cost` back instead of taking it.
    pub refund: bool,
    /// A limit to use instead of the rule's or the file's.
    pub limit_override: Option<LimitOverride>,
}

impl Descriptor<'_> {
    /// The descriptor as a divvy-rules hit (its entries copied into one
    /// operation string).
    pub fn hit(&self) -> Hit {
        Hit {
            operation: Operation::from_pairs(self.entries.iter().copied()),
            cost: self.cost,
            refund: self.refund,
            limit_override: self.limit_override,
        }
    }

    /// A hit's pairs as a descriptor (sorted by key: the order a hit keeps).
    pub fn of_hit(hit: &Hit) -> Descriptor<'_> {
        Descriptor {
            entries: hit.operation.pairs().collect(),
            cost: hit.cost,
            refund: hit.refund,
            limit_override: hit.limit_override,
        }
    }

    /// The override as envoyproxy/ratelimit reads it: requests per unit and
    /// the unit. A window that is no Envoy unit cannot come from Envoy and
    /// is no override there.
    pub fn envoy_override(&self) -> Option<(u32, EnvoyUnit)> {
        let o = self.limit_override?;
        let unit = EnvoyUnit::of_seconds(o.reset_seconds)?;
        Some((u32::try_from(o.credit_limit).unwrap_or(u32::MAX), unit))
    }
}

/// A request's descriptors, in whichever shape its protocol parsed them.
#[derive(Debug, Clone, Copy)]
pub enum Items<'a> {
    /// Envoy's descriptors (gRPC, `POST /json`): entries in request order.
    Descriptors(&'a [Descriptor<'a>]),
    /// Hits already parsed into operations (the line protocol, tests).
    Hits(&'a [Hit]),
}

impl Items<'_> {
    /// How many descriptors the request has.
    pub fn len(&self) -> usize {
        match self {
            Items::Descriptors(d) => d.len(),
            Items::Hits(h) => h.len(),
        }
    }

    /// Whether the request has no descriptor.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Who asks: how the request's descriptors are charged follows from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// Envoy's ShouldRateLimit or `POST /json`: one request, charged as the
    /// policy's `charge` says.
    Envoy,
    /// A line connection's pipelined HITs: independent requests of one
    /// descriptor each, each charged on its own.
    Line,
}

/// One request to decide, whatever protocol brought it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// Who asks.
    pub caller: Caller,
    /// The Envoy domain; `None` for line-protocol HITs.
    pub domain: Option<&'a str>,
    /// The descriptors, in request order.
    pub items: Items<'a>,
    /// The store is waited for until then at most (then the failure policy
    /// decides); `None`: the store's own timeout.
    pub deadline: Option<tokio::time::Instant>,
}

impl<'a> Request<'a> {
    /// Envoy's request of `domain`, with no deadline of its own.
    pub fn envoy(domain: &'a str, descriptors: &'a [Descriptor<'a>]) -> Request<'a> {
        Request {
            caller: Caller::Envoy,
            domain: Some(domain),
            items: Items::Descriptors(descriptors),
            deadline: None,
        }
    }

    /// A request of already parsed hits (`domain` `None`: the line protocol's
    /// domain-less rules), decided together.
    pub fn hits(domain: Option<&'a str>, hits: &'a [Hit]) -> Request<'a> {
        Request {
            caller: Caller::Envoy,
            domain,
            items: Items::Hits(hits),
            deadline: None,
        }
    }

    /// A line connection's pipelined HITs, each charged on its own.
    pub fn line(hits: &'a [Hit]) -> Request<'a> {
        Request {
            caller: Caller::Line,
            domain: None,
            items: Items::Hits(hits),
            deadline: None,
        }
    }

    /// The same request, waiting for the store until `deadline` at most.
    pub fn until(mut self, deadline: Option<tokio::time::Instant>) -> Request<'a> {
        self.deadline = deadline;
        self
    }
}
