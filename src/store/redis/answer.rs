//! The counter script's answer: one MessagePack array of integers
//! (`packed` in lone.lua), read here. Redis's `cmsgpack` writes each
//! number in its shortest form, and a number with a fraction as a double,
//! which is truncated as Redis truncates a Lua number in an integer reply.
//! The `rmp` crate reads the markers and their data.

use crate::store::StoreError;

use rmp::decode::{read_marker, RmpRead};
use rmp::Marker;

/// The integers of the counter script's answer, in order.
pub fn integers(raw: &[u8]) -> Result<Vec<i64>, StoreError> {
    let mut rd = raw;
    let malformed = |rd: &[u8]| {
        StoreError::Refused(format!(
            "redis: the counter script's answer is not a MessagePack array of numbers (at byte {} of {})",
            raw.len() - rd.len(),
            raw.len()
        ))
    };
    let n = array_len(&mut rd).ok_or_else(|| malformed(rd))?;
    // Every element is at least one byte: a count beyond the bytes left is
    // malformed, and never sizes an allocation.
    if n > rd.len() {
        return Err(malformed(rd));
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(integer(&mut rd).ok_or_else(|| malformed(rd))?);
    }
    if !rd.is_empty() {
        return Err(malformed(rd));
    }
    Ok(out)
}

/// An array's length (an empty Lua table may be written as an empty map).
fn array_len(rd: &mut &[u8]) -> Option<usize> {
    Some(match read_marker(rd).ok()? {
        Marker::FixArray(n) => usize::from(n),
        Marker::FixMap(0) => 0,
        Marker::Array16 => usize::from(rd.read_data_u16().ok()?),
        Marker::Array32 => usize::try_from(rd.read_data_u32().ok()?).ok()?,
        _ => return None,
    })
}

/// One number: an integer of any width, or a double truncated (`as`
/// saturates, as Redis's cast of a Lua number does in range).
fn integer(rd: &mut &[u8]) -> Option<i64> {
    Some(match read_marker(rd).ok()? {
        Marker::FixPos(n) => i64::from(n),
        Marker::FixNeg(n) => i64::from(n),
        Marker::U8 => i64::from(rd.read_data_u8().ok()?),
        Marker::U16 => i64::from(rd.read_data_u16().ok()?),
        Marker::U32 => i64::from(rd.read_data_u32().ok()?),
        Marker::U64 => i64::try_from(rd.read_data_u64().ok()?).unwrap_or(i64::MAX),
        Marker::I8 => i64::from(rd.read_data_i8().ok()?),
        Marker::I16 => i64::from(rd.read_data_i16().ok()?),
        Marker::I32 => i64::from(rd.read_data_i32().ok()?),
        Marker::I64 => rd.read_data_i64().ok()?,
        Marker::F32 => rd.read_data_f32().ok()? as i64,
        Marker::F64 => rd.read_data_f64().ok()? as i64,
        _ => return None,
    })
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
