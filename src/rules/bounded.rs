//! Counter keys whose size does not depend on what clients send.
//!
//! An actor value longer than [`MAX_VALUE_BYTES`] (or containing the marker
//! [`MARK`]) is written as its first [`PREFIX_BYTES`] bytes (cut at a
//! character boundary, for people reading keys), the marker, and a keyed
//! 128-bit SipHash-1-3 of the whole value in hex:
//! `divvy:path=/x:0123456789abcdef~h5d41402abc4b2a76b9719d911017c592:10:60`.
//! Shorter values stay as they are, so existing keys do not change. A value
//! containing the marker is always hashed, so no short value spells a hashed
//! form; the hash key is secret (random at start, or agreed through Redis by
//! every replica), so no client can aim a value at another's counter.

use std::fmt::Write as _;
use std::hash::Hasher;
use std::sync::RwLock;

use siphasher::sip128::{Hasher128, SipHasher13};

/// Values up to this many bytes are kept whole in counter keys.
pub const MAX_VALUE_BYTES: usize = 64;
/// The readable part kept of a longer value.
pub const PREFIX_BYTES: usize = 16;
/// Marks a hashed value in a key.
pub const MARK: &str = "~h";
/// The Redis key holding the shared hash key (32 hex digits).
pub const SECRET_KEY: &str = "divvy:key-secret";

static SECRET: RwLock<Option<(u64, u64)>> = RwLock::new(None);

fn random_secret() -> (u64, u64) {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // No OS randomness: fall back to the std hasher's random keys.
        use std::hash::BuildHasher;
        let s = std::collections::hash_map::RandomState::new();
        return (s.hash_one(1u8), s.hash_one(2u8));
    }
    let (a, b) = bytes.split_at(8);
    (
        u64::from_le_bytes(a.try_into().unwrap_or_default()),
        u64::from_le_bytes(b.try_into().unwrap_or_default()),
    )
}

fn secret() -> (u64, u64) {
    if let Some(s) = *SECRET.read().unwrap_or_else(|e| e.into_inner()) {
        return s;
    }
    let mut slot = SECRET.write().unwrap_or_else(|e| e.into_inner());
    *slot.get_or_insert_with(random_secret)
}

/// Uses `hex` (32 hex digits) as the hash key from now on; false when it
/// is not 32 hex digits (nothing changes).
pub fn set_secret_hex(hex: &str) -> bool {
    let parse = |s: &str| u64::from_str_radix(s, 16).ok();
    match (
        hex.len(),
        hex.get(..16).and_then(parse),
        hex.get(16..).and_then(parse),
    ) {
        (32, Some(a), Some(b)) => {
            *SECRET.write().unwrap_or_else(|e| e.into_inner()) = Some((a, b));
            true
        }
        _ => false,
    }
}

/// The hash key in use, as 32 hex digits.
pub fn secret_hex() -> String {
    let (a, b) = secret();
    format!("{a:016x}{b:016x}")
}

/// A fresh random hash key as 32 hex digits (to offer to Redis).
pub fn fresh_secret_hex() -> String {
    let (a, b) = random_secret();
    format!("{a:016x}{b:016x}")
}

/// Whether `value` is written hashed.
pub fn is_long(value: &str) -> bool {
    value.len() > MAX_VALUE_BYTES || has_mark(value.as_bytes())
}

// `has_mark` looks for a marker of two bytes.
const _: () = assert!(MARK.len() == 2);

/// Whether `value` holds [`MARK`]. Values here are at most
/// [`MAX_VALUE_BYTES`] long: a plain scan of byte pairs costs a few
/// instructions a byte, where `memchr` and `str::contains` pay a setup
/// of their own on every call that is larger than such a scan.
fn has_mark(value: &[u8]) -> bool {
    let [first, second] = *MARK.as_bytes() else {
        return false;
    };
    value.windows(2).any(|w| w[0] == first && w[1] == second)
}

/// Appends `value` to `key`, bounded as the module describes.
pub fn push_value(key: &mut String, value: &str) {
    if !is_long(value) {
        key.push_str(value);
        return;
    }
    let mut cut = PREFIX_BYTES.min(value.len());
    while !value.is_char_boundary(cut) {
        cut -= 1;
    }
    // The readable prefix must not carry the marker itself.
    let prefix = value[..cut].split(MARK).next().unwrap_or("");
    key.push_str(prefix.strip_suffix('~').unwrap_or(prefix));
    key.push_str(MARK);
    let (k0, k1) = secret();
    let mut h = SipHasher13::new_with_keys(k0, k1);
    h.write(value.as_bytes());
    let digest = h.finish128();
    // Writing to a String cannot fail.
    let _ = write!(key, "{:016x}{:016x}", digest.h1, digest.h2);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounded(v: &str) -> String {
        let mut k = String::new();
        push_value(&mut k, v);
        k
    }

    #[test]
    fn short_values_are_kept_and_long_ones_bounded() {
        assert_eq!(bounded("1.2.3.4"), "1.2.3.4");
        let exactly = "x".repeat(MAX_VALUE_BYTES);
        assert_eq!(bounded(&exactly), exactly);
        let long = "a".repeat(300_000);
        let k = bounded(&long);
        assert_eq!(k.len(), PREFIX_BYTES + MARK.len() + 32);
        assert!(k.starts_with("aaaaaaaaaaaaaaaa~h"), "{k}");
    }

    #[test]
    fn no_short_value_spells_a_hashed_one() {
        let hashed = bounded(&"z".repeat(100));
        // Sent as a value itself, it carries the marker: hashed again.
        assert_ne!(bounded(&hashed), hashed);
        assert!(is_long("ab~hcd"));
        // Prefixes never end in a partial character or carry the marker.
        let k = bounded(&format!("{}{}", "é".repeat(40), "x"));
        assert!(k.starts_with("éééééééé~h"), "{k}");
        let k = bounded(&format!("abc~h{}", "q".repeat(100)));
        assert!(k.starts_with("abc~h"), "{k}");
        let k = bounded(&format!("{}~{}", "a".repeat(15), "h".repeat(100)));
        assert!(k.starts_with("aaaaaaaaaaaaaaa~h"), "{k}");
        assert_eq!(k.matches(MARK).count(), 1, "{k}");
    }

    #[test]
    fn the_mark_is_found_wherever_it_is() {
        for v in ["~h", "a~h", "~ha", "~~h", "~", "h~", "h", "", "~x~h", "~H"] {
            assert_eq!(has_mark(v.as_bytes()), v.contains(MARK), "{v:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn the_mark_search_agrees_with_contains(v in "[~ha-c]{0,12}") {
            proptest::prop_assert_eq!(has_mark(v.as_bytes()), v.contains(MARK));
        }
    }

    #[test]
    fn the_secret_can_be_shared() {
        assert!(!set_secret_hex("nothex"));
        let long = "v".repeat(100);
        assert!(set_secret_hex("000102030405060708090a0b0c0d0e0f"));
        let a = bounded(&long);
        assert!(set_secret_hex("000102030405060708090a0b0c0d0e0f"));
        assert_eq!(bounded(&long), a);
        // (The only test that sets the key: the others do not depend on it.)
        let mut other = long.clone();
        other.push('b');
        assert_ne!(bounded(&other), a);
        assert!(set_secret_hex("100102030405060708090a0b0c0d0e0f"));
        assert_ne!(bounded(&long), a, "another key, another hash");
    }
}
