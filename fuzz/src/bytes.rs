//! The byte layout the inputs are read from: fixed-width little-endian numbers, strings of at
//! most 255 bytes behind a one-byte length, longer byte strings behind a two-byte length.

/// Reads an input's fields off the fuzzer's bytes. Past the end it yields zeros and empty
/// slices, so that every input reads as something.
#[derive(Debug)]
pub struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Reader<'a> {
        Reader { data }
    }

    /// Up to `len` bytes: fewer at the end of the input.
    pub fn bytes(&mut self, len: usize) -> &'a [u8] {
        let (taken, rest) = self.data.split_at(len.min(self.data.len()));
        self.data = rest;
        taken
    }

    pub fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0; N];
        let taken = self.bytes(N);
        out[..taken.len()].copy_from_slice(taken);
        out
    }

    /// A string for an AMQP short string (at most 255 bytes): a length byte, then the bytes,
    /// invalid UTF-8 replaced (and the result cut back to 255 bytes at a character boundary).
    pub fn short_text(&mut self) -> String {
        let mut text = String::from_utf8_lossy(self.short_bytes()).into_owned();
        let mut end = text.len().min(255);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text
    }

    /// Bytes behind a one-byte length.
    pub fn short_bytes(&mut self) -> &'a [u8] {
        let len = usize::from(self.u8());
        self.bytes(len)
    }

    /// Bytes behind a two-byte length.
    pub fn long_bytes(&mut self) -> &'a [u8] {
        let len = usize::from(self.u16());
        self.bytes(len)
    }

    /// Everything not read yet.
    pub fn rest(self) -> &'a [u8] {
        self.data
    }
}

/// Writes fields in the layout [`Reader`] reads: what the corpus seeds are made with.
#[derive(Debug, Default)]
pub struct Writer {
    out: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, value: u8) -> &mut Writer {
        self.out.push(value);
        self
    }

    pub fn u16(&mut self, value: u16) -> &mut Writer {
        self.bytes(&value.to_le_bytes())
    }

    pub fn u32(&mut self, value: u32) -> &mut Writer {
        self.bytes(&value.to_le_bytes())
    }

    pub fn u64(&mut self, value: u64) -> &mut Writer {
        self.bytes(&value.to_le_bytes())
    }

    pub fn bytes(&mut self, bytes: &[u8]) -> &mut Writer {
        self.out.extend_from_slice(bytes);
        self
    }

    /// # Panics
    ///
    /// When `text` is longer than 255 bytes, which [`Reader::short_text`] cannot give back.
    pub fn short_text(&mut self, text: &str) -> &mut Writer {
        self.short_bytes(text.as_bytes())
    }

    /// # Panics
    ///
    /// When `bytes` is longer than 255 bytes.
    pub fn short_bytes(&mut self, bytes: &[u8]) -> &mut Writer {
        let len = u8::try_from(bytes.len()).expect("at most 255 bytes");
        self.u8(len).bytes(bytes)
    }

    /// # Panics
    ///
    /// When `bytes` is longer than 65 535 bytes.
    pub fn long_bytes(&mut self, bytes: &[u8]) -> &mut Writer {
        let len = u16::try_from(bytes.len()).expect("at most 65 535 bytes");
        self.u16(len).bytes(bytes)
    }

    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_end_everything_is_zero_or_empty() {
        let mut reader = Reader::new(&[1, 2, 3]);
        assert_eq!(reader.u16(), 0x0201);
        assert_eq!(reader.u32(), 3);
        assert_eq!(reader.u64(), 0);
        assert_eq!(reader.short_text(), "");
        assert!(reader.rest().is_empty());
    }

    #[test]
    fn short_text_is_valid_utf8_of_at_most_255_bytes() {
        let mut input = vec![255];
        input.extend(std::iter::repeat_n(0xff, 255));
        let text = Reader::new(&input).short_text();
        assert!(text.len() <= 255);
        assert!(text.chars().all(|c| c == char::REPLACEMENT_CHARACTER));
    }
}
