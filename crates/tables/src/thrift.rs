//! The Thrift compact protocol, write side only: what a Parquet footer and page
//! header need (structs, lists, i32/i64, binary, bool).

/// Type nibbles of the compact protocol.
pub(crate) mod ty {
    pub const TRUE: u8 = 1;
    pub const FALSE: u8 = 2;
    pub const I32: u8 = 5;
    pub const I64: u8 = 6;
    pub const BINARY: u8 = 8;
    pub const LIST: u8 = 9;
    pub const STRUCT: u8 = 12;
}

/// A compact-protocol writer. Field ids are delta-encoded against the previous
/// field of the same struct, so it keeps one "last id" per open struct.
pub(crate) struct Writer {
    pub buf: Vec<u8>,
    last: Vec<i16>,
}

impl Writer {
    pub fn new() -> Writer {
        Writer {
            buf: Vec::new(),
            last: vec![0],
        }
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    fn zigzag(&mut self, v: i64) {
        self.varint(((v << 1) ^ (v >> 63)) as u64);
    }

    fn field(&mut self, id: i16, t: u8) {
        let last = self.last.last_mut().expect("inside a struct");
        let delta = id - *last;
        *last = id;
        if (1..=15).contains(&delta) {
            self.buf.push(((delta as u8) << 4) | t);
        } else {
            self.buf.push(t);
            self.zigzag(id as i64);
        }
    }

    pub fn i32(&mut self, id: i16, v: i32) {
        self.field(id, ty::I32);
        self.zigzag(v as i64);
    }

    pub fn i64(&mut self, id: i16, v: i64) {
        self.field(id, ty::I64);
        self.zigzag(v);
    }

    pub fn binary(&mut self, id: i16, v: &[u8]) {
        self.field(id, ty::BINARY);
        self.varint(v.len() as u64);
        self.buf.extend_from_slice(v);
    }

    pub fn bool(&mut self, id: i16, v: bool) {
        self.field(id, if v { ty::TRUE } else { ty::FALSE });
    }

    /// Opens a struct-valued field; close it with [`Writer::end`].
    pub fn begin(&mut self, id: i16) {
        self.field(id, ty::STRUCT);
        self.last.push(0);
    }

    /// Closes the innermost struct (or, at the top, ends the message).
    pub fn end(&mut self) {
        self.buf.push(0);
        self.last.pop();
    }

    /// A list-valued field of `n` elements of type `t`; the elements follow.
    pub fn list(&mut self, id: i16, t: u8, n: usize) {
        self.field(id, ty::LIST);
        if n < 15 {
            self.buf.push(((n as u8) << 4) | t);
        } else {
            self.buf.push(0xF0 | t);
            self.varint(n as u64);
        }
    }

    /// An element of a list of i32s.
    pub fn elem_i32(&mut self, v: i32) {
        self.zigzag(v as i64);
    }

    /// An element of a list of binaries.
    pub fn elem_binary(&mut self, v: &[u8]) {
        self.varint(v.len() as u64);
        self.buf.extend_from_slice(v);
    }

    /// Opens a struct that is an element of a list; close it with [`Writer::end`].
    pub fn elem_struct(&mut self) {
        self.last.push(0);
    }

    /// The finished message (the top-level struct's stop byte written).
    pub fn finish(mut self) -> Vec<u8> {
        self.buf.push(0);
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_long_field_headers() {
        let mut w = Writer::new();
        w.i32(1, 3);
        w.i64(17, -1);
        let b = w.finish();
        // field 1 i32 (delta 1): 0x15, zigzag(3)=6; field 17 after 1 (delta 16): long form.
        assert_eq!(b, vec![0x15, 0x06, 0x06, 0x22, 0x01, 0x00]);
    }

    #[test]
    fn nested_structs_restart_field_ids() {
        let mut w = Writer::new();
        w.i32(1, 0);
        w.begin(5);
        w.i32(1, 3);
        w.end();
        w.i32(6, 1);
        let b = w.finish();
        assert_eq!(
            b,
            vec![0x15, 0x00, 0x4c, 0x15, 0x06, 0x00, 0x15, 0x02, 0x00]
        );
    }

    #[test]
    fn lists_of_more_than_fourteen() {
        let mut w = Writer::new();
        w.list(1, ty::I32, 20);
        for i in 0..20 {
            w.elem_i32(i);
        }
        let b = w.finish();
        assert_eq!(&b[..3], &[0x19, 0xF5, 20]);
    }
}
