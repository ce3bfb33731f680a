//! The counter script's answer: one MessagePack array of integers
//! (`packed` in lone.lua), read here. Redis's `cmsgpack` writes each
//! number in its shortest form, and a number with a fraction as a double,
//! which is truncated as Redis truncates a Lua number in an integer reply.

use crate::store::StoreError;

/// The integers of the counter script's answer, in order.
pub fn integers(raw: &[u8]) -> Result<Vec<i64>, StoreError> {
    let mut r = Reader { raw, at: 0 };
    let n = r.array_len()?;
    // Every element is at least one byte: a count beyond the bytes left is
    // malformed, and never sizes an allocation.
    if n > raw.len() {
        return Err(r.malformed());
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(r.integer()?);
    }
    if r.at != raw.len() {
        return Err(r.malformed());
    }
    Ok(out)
}

struct Reader<'a> {
    raw: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn malformed(&self) -> StoreError {
        StoreError::Refused(format!(
            "redis: the counter script's answer is not a MessagePack array of numbers (at byte {} of {})",
            self.at,
            self.raw.len()
        ))
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], StoreError> {
        let bytes = self
            .raw
            .get(self.at..self.at + N)
            .and_then(|b| <[u8; N]>::try_from(b).ok())
            .ok_or_else(|| self.malformed())?;
        self.at += N;
        Ok(bytes)
    }

    fn array_len(&mut self) -> Result<usize, StoreError> {
        let [tag] = self.take::<1>()?;
        Ok(match tag {
            0x90..=0x9f => usize::from(tag & 0x0f),
            // An empty Lua table may be written as an empty map.
            0x80 => 0,
            0xdc => usize::from(u16::from_be_bytes(self.take()?)),
            0xdd => usize::try_from(u32::from_be_bytes(self.take()?)).unwrap_or(usize::MAX),
            _ => return Err(self.malformed()),
        })
    }

    fn integer(&mut self) -> Result<i64, StoreError> {
        let [tag] = self.take::<1>()?;
        Ok(match tag {
            0x00..=0x7f => i64::from(tag),
            0xe0..=0xff => i64::from(tag as i8),
            0xcc => i64::from(u8::from_be_bytes(self.take()?)),
            0xcd => i64::from(u16::from_be_bytes(self.take()?)),
            0xce => i64::from(u32::from_be_bytes(self.take()?)),
            0xcf => i64::try_from(u64::from_be_bytes(self.take()?)).unwrap_or(i64::MAX),
            0xd0 => i64::from(i8::from_be_bytes(self.take()?)),
            0xd1 => i64::from(i16::from_be_bytes(self.take()?)),
            0xd2 => i64::from(i32::from_be_bytes(self.take()?)),
            0xd3 => i64::from_be_bytes(self.take()?),
            // `as` saturates, as Redis's cast of a Lua number does in range.
            0xca => f32::from_be_bytes(self.take()?) as i64,
            0xcb => f64::from_be_bytes(self.take()?) as i64,
            _ => return Err(self.malformed()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_integer_form_reads_back() {
        let mut raw = vec![0xdc, 0x00, 0x0c];
        raw.extend([0x05, 0xff, 0xcc, 0xc8, 0xcd, 0x01, 0x00]);
        raw.extend([0xce, 0x00, 0x01, 0x00, 0x00]);
        raw.extend([0xcf, 0, 0, 0, 1, 0, 0, 0, 0]);
        raw.extend([0xd0, 0x80, 0xd1, 0xff, 0x00, 0xd2, 0xff, 0xff, 0x00, 0x00]);
        raw.extend([0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe]);
        raw.push(0xcb);
        raw.extend(2.75f64.to_be_bytes());
        raw.push(0xca);
        raw.extend((-1.5f32).to_be_bytes());
        assert_eq!(
            integers(&raw).expect("well formed"),
            [
                5,
                -1,
                200,
                256,
                65_536,
                1 << 32,
                -128,
                -256,
                -65_536,
                -2,
                2,
                -1
            ]
        );
        assert_eq!(integers(&[0x92, 0x01, 0x02]).expect("fixarray"), [1, 2]);
        assert!(integers(&[0x90]).expect("empty").is_empty());
        assert!(integers(&[0x80]).expect("empty map").is_empty());
    }

    #[test]
    fn anything_else_is_refused_without_a_panic() {
        for bad in [
            &[][..],
            &[0x91],                         // an element missing
            &[0x91, 0x01, 0x02],             // a byte too many
            &[0x91, 0xcd, 0x01],             // a u16 cut short
            &[0x91, 0xa1, 0x61],             // a string
            &[0xdd, 0xff, 0xff, 0xff, 0xff], // a count past the bytes
            &[0x05],                         // not an array
        ] {
            let err = integers(bad).expect_err("malformed");
            assert!(err.to_string().contains("MessagePack"), "{err}");
        }
    }
}
