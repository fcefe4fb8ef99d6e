//! Little-endian byte encoding helpers shared by every stored value format.
//!
//! Writers append to a `Vec<u8>`; the [`Reader`] walks a slice and turns every shortfall into
//! [`CodecError`], so decoding untrusted or damaged bytes never panics.

/// A stored value could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {reason}")]
pub struct CodecError {
    /// The kind of value being decoded.
    pub what: &'static str,
    pub reason: String,
}

/// Appends little-endian fields.
pub trait Put {
    fn put_u8(&mut self, v: u8);
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    fn put_u64(&mut self, v: u64);
    fn put_i64(&mut self, v: i64);
    fn put_f32(&mut self, v: f32);
    /// A length-prefixed (u32) byte string.
    fn put_bytes(&mut self, v: &[u8]);
    /// An unsigned LEB128 varint: seven bits a byte, lowest first, the top bit set on every
    /// byte but the last (one byte below 128, at most ten).
    fn put_varint(&mut self, v: u64);
}

impl Put for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_i64(&mut self, v: i64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_f32(&mut self, v: f32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_bytes(&mut self, v: &[u8]) {
        self.put_u32(u32::try_from(v.len()).expect("stored byte strings are under 4 GiB"));
        self.extend_from_slice(v);
    }
    fn put_varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.push((v as u8 & 0x7F) | 0x80);
            v >>= 7;
        }
        self.push(v as u8);
    }
}

/// Reads little-endian fields from a slice.
pub struct Reader<'a> {
    what: &'static str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader over `bytes`, which hold a value of kind `what` (named in errors).
    pub fn new(what: &'static str, bytes: &'a [u8]) -> Self {
        Self { what, bytes, at: 0 }
    }

    /// An error about the value being read.
    pub fn error(&self, reason: impl Into<String>) -> CodecError {
        CodecError {
            what: self.what,
            reason: reason.into(),
        }
    }

    pub fn slice(&mut self, len: usize) -> Result<&'a [u8], CodecError> {
        let end = self
            .at
            .checked_add(len)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| self.error(format!("truncated at byte {}", self.at)))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.slice(N)?);
        Ok(out)
    }

    pub fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.array::<1>()?[0])
    }
    pub fn u16(&mut self) -> Result<u16, CodecError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32, CodecError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, CodecError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub fn i64(&mut self) -> Result<i64, CodecError> {
        Ok(i64::from_le_bytes(self.array()?))
    }
    pub fn f32(&mut self) -> Result<f32, CodecError> {
        Ok(f32::from_le_bytes(self.array()?))
    }
    /// A length-prefixed (u32) byte string.
    pub fn bytes(&mut self) -> Result<&'a [u8], CodecError> {
        let len = self.u32()? as usize;
        self.slice(len)
    }
    /// A length-prefixed UTF-8 string.
    pub fn str(&mut self) -> Result<&'a str, CodecError> {
        let bytes = self.bytes()?;
        std::str::from_utf8(bytes).map_err(|_| self.error("string is not UTF-8"))
    }
    /// A [`Put::put_varint`] varint; more than 64 bits is an error. Read from the slice
    /// directly: a retrieval row holds two a token, and the arena's build decodes every row.
    pub fn varint(&mut self) -> Result<u64, CodecError> {
        let rest = &self.bytes[self.at..];
        let mut value = 0u64;
        for (i, &byte) in rest.iter().take(10).enumerate() {
            let bits = u64::from(byte & 0x7F);
            let shift = 7 * i;
            if bits << shift >> shift != bits {
                return Err(self.error("varint over 64 bits"));
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                self.at += i + 1;
                return Ok(value);
            }
        }
        Err(if rest.len() < 10 {
            self.error(format!("truncated at byte {}", self.bytes.len()))
        } else {
            self.error("varint over ten bytes")
        })
    }
    /// A u32 field of a value whose encoding writes it as a varint (`varint`) or fixed-width:
    /// the reader of a value that has both encodings.
    pub fn u32_or_varint(&mut self, varint: bool) -> Result<u32, CodecError> {
        if varint {
            self.varint_u32()
        } else {
            self.u32()
        }
    }
    /// A varint that must fit 32 bits.
    pub fn varint_u32(&mut self) -> Result<u32, CodecError> {
        let v = self.varint()?;
        u32::try_from(v).map_err(|_| self.error(format!("{v} does not fit 32 bits")))
    }
    /// A count of following items, bounded by the bytes left (each item at least `min_item`
    /// bytes), so a damaged count cannot reserve unbounded memory.
    pub fn count(&mut self, min_item: usize) -> Result<usize, CodecError> {
        let n = self.u32()? as usize;
        self.bounded(n, min_item)
    }
    /// [`Reader::count`] written as a varint.
    pub fn varint_count(&mut self, min_item: usize) -> Result<usize, CodecError> {
        let n = self.varint()?;
        self.bounded(usize::try_from(n).unwrap_or(usize::MAX), min_item)
    }
    fn bounded(&self, n: usize, min_item: usize) -> Result<usize, CodecError> {
        if n.saturating_mul(min_item) > self.bytes.len() - self.at {
            return Err(self.error(format!("count {n} exceeds the remaining bytes")));
        }
        Ok(n)
    }
    /// Fail unless every byte was consumed.
    pub fn finish(self) -> Result<(), CodecError> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(self.error(format!("{} trailing bytes", self.bytes.len() - self.at)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn fields_round_trip(a: u8, b: u16, c: u32, d: u64, e: i64, f: f32, s: Vec<u8>) {
            let mut out = Vec::new();
            out.put_u8(a);
            out.put_u16(b);
            out.put_u32(c);
            out.put_u64(d);
            out.put_i64(e);
            out.put_f32(f);
            out.put_bytes(&s);
            let mut r = Reader::new("test", &out);
            prop_assert_eq!(r.u8().unwrap(), a);
            prop_assert_eq!(r.u16().unwrap(), b);
            prop_assert_eq!(r.u32().unwrap(), c);
            prop_assert_eq!(r.u64().unwrap(), d);
            prop_assert_eq!(r.i64().unwrap(), e);
            prop_assert_eq!(r.f32().unwrap().to_bits(), f.to_bits());
            prop_assert_eq!(r.bytes().unwrap(), &s[..]);
            r.finish().unwrap();
        }

        #[test]
        fn truncation_is_an_error(cut in 0usize..12) {
            let mut out = Vec::new();
            out.put_u64(7);
            out.put_u32(9);
            let mut r = Reader::new("test", &out[..cut]);
            prop_assert!(r.u64().and_then(|_| r.u32()).is_err());
        }

        #[test]
        fn varints_round_trip_in_their_length(values: Vec<u64>) {
            let mut out = Vec::new();
            for &v in &values {
                out.put_varint(v);
            }
            let length = |v: u64| (64 - v.leading_zeros() as usize).div_ceil(7).max(1);
            prop_assert_eq!(out.len(), values.iter().map(|&v| length(v)).sum::<usize>());
            let mut r = Reader::new("test", &out);
            for &v in &values {
                prop_assert_eq!(r.varint().unwrap(), v);
            }
            r.finish().unwrap();
        }
    }

    #[test]
    fn a_varint_past_64_bits_or_cut_short_is_an_error() {
        let eleven = [0xFF; 11];
        assert!(Reader::new("test", &eleven).varint().is_err());
        // Ten bytes whose last carries more than the 64th bit.
        let mut wide = [0xFF; 10];
        wide[9] = 0x02;
        assert!(Reader::new("test", &wide).varint().is_err());
        wide[9] = 0x01;
        assert_eq!(Reader::new("test", &wide).varint().unwrap(), u64::MAX);
        assert!(Reader::new("test", &[0x80, 0x80]).varint().is_err());
        let mut big = Vec::new();
        big.put_varint(1 << 32);
        assert!(Reader::new("test", &big).varint_u32().is_err());
        let mut count = Vec::new();
        count.put_varint(5);
        count.extend_from_slice(&[0; 9]);
        assert!(Reader::new("test", &count).varint_count(2).is_err());
        assert_eq!(Reader::new("test", &count).varint_count(1).unwrap(), 5);
    }
}
