//! A fast path for checking JSON append bodies and finding their messages.
//!
//! Every append to a JSON stream is checked before it is written, and a 1 KiB
//! message cost ~3,000 instructions in `serde_json` (most of it the byte-at-a-time
//! and word-at-a-time scans of string contents; ~6% of an append's instructions at
//! the throughput target). This scanner reads the same grammar, with string contents
//! skipped 16 bytes at a time, and only ever says "these are the spans" or "not
//! sure": anything it does not accept (an error, a `\u` escape, nesting deeper than
//! [`MAX_DEPTH`]) goes to `serde_json`, which decides and words the error. So the
//! scanner can only make a difference by accepting what `serde_json` rejects, and a
//! differential test against `serde_json` guards exactly that.
//!
//! Outside strings the grammar allows ASCII only, and inside strings any byte but
//! `"`, `\` and control characters goes unexamined, so the scanner is safe on any
//! bytes; it also notes whether it met a byte above 0x7f. A body it accepts without
//! one is ASCII and so valid UTF-8, and the caller's UTF-8 check (~700 instructions
//! for 1 KiB) is left for the bodies that have one.

use std::ops::Range;

/// Deeper nesting is left to `serde_json` (whose own limit is 128).
const MAX_DEPTH: u32 = 64;

/// What a body holds, when the scanner is sure it is valid JSON.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Messages {
    /// A top-level array: its elements' spans (possibly none).
    Array(Vec<Range<usize>>),
    /// One value that is not an array.
    One(Range<usize>),
}

/// The body's messages, each span without surrounding whitespace; `None` if the
/// body is invalid or the scanner is not sure.
#[cfg(test)]
pub(crate) fn messages(body: &[u8]) -> Option<Messages> {
    scan(body).map(|(found, _)| found)
}

/// [`messages`], and whether the body is all ASCII (when false, it may hold a byte
/// above 0x7f: its UTF-8 is still to be checked).
pub(crate) fn scan(body: &[u8]) -> Option<(Messages, bool)> {
    let mut s = Scanner {
        b: body,
        i: 0,
        high: false,
    };
    s.whitespace();
    let found = if s.peek()? == b'[' {
        let mut spans = Vec::new();
        s.items(b']', |s| {
            let start = s.i;
            s.value(1)?;
            spans.push(start..s.i);
            Some(())
        })?;
        Messages::Array(spans)
    } else {
        let start = s.i;
        s.value(0)?;
        Messages::One(start..s.i)
    };
    s.whitespace();
    (s.i == body.len()).then_some((found, !s.high))
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
    /// A byte above 0x7f may have been passed over (inside a string).
    high: bool,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    fn value(&mut self, depth: u32) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' => self.string(),
            b'{' => self.items(b'}', |s| {
                if s.peek()? != b'"' {
                    return None;
                }
                s.string()?;
                s.whitespace();
                if s.next()? != b':' {
                    return None;
                }
                s.whitespace();
                s.value(depth + 1)
            }),
            b'[' => self.items(b']', |s| s.value(depth + 1)),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// From an opening bracket to after `close`: items separated by commas, each
    /// read by `item` from its first non-blank byte.
    fn items(&mut self, close: u8, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.i += 1;
        self.whitespace();
        if self.peek()? == close {
            self.i += 1;
            return Some(());
        }
        loop {
            self.whitespace();
            item(self)?;
            self.whitespace();
            match self.next()? {
                b',' => continue,
                c if c == close => return Some(()),
                _ => return None,
            }
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i + word.len();
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    fn number(&mut self) -> Option<()> {
        if self.peek()? == b'-' {
            self.i += 1;
        }
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            self.some_digits()?;
        }
        // A number runs until a byte that can follow a value ("01", "1.5.2" are
        // not numbers).
        match self.peek() {
            None | Some(b',' | b']' | b'}' | b' ' | b'\n' | b'\t' | b'\r') => Some(()),
            Some(_) => None,
        }
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
    }

    fn some_digits(&mut self) -> Option<()> {
        let start = self.i;
        self.digits();
        (self.i > start).then_some(())
    }

    /// A string, from its opening quote to after its closing one.
    fn string(&mut self) -> Option<()> {
        self.i += 1;
        loop {
            let (plain, high) = plain_prefix(&self.b[self.i..]);
            self.i += plain;
            self.high |= high;
            match self.next()? {
                b'"' => return Some(()),
                b'\\' => match self.next()? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                    // `\u` escapes (and their surrogate rules) are left to serde_json.
                    _ => return None,
                },
                // A control character, which JSON strings must escape.
                _ => return None,
            }
        }
    }
}

/// How many leading bytes of `s` need no attention inside a string: not `"`, not
/// `\`, not a control character (below 0x20); and whether a byte above 0x7f may be
/// among them (true for every such byte among them; possibly for one past them).
fn plain_prefix(s: &[u8]) -> (usize, bool) {
    let mut i = 0;
    let mut high = 0;
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        // SAFETY: SSE2 is part of the x86_64 baseline, and every load reads 16
        // bytes inside `s` (i + 16 <= s.len()), unaligned.
        unsafe {
            let quote = _mm_set1_epi8(b'"' as i8);
            let backslash = _mm_set1_epi8(b'\\' as i8);
            let below_space = _mm_set1_epi8(0x1f);
            while i + 16 <= s.len() {
                let v = _mm_loadu_si128(s.as_ptr().add(i).cast());
                // Unsigned min(v, 0x1f) == v exactly for the bytes 0x00..=0x1f.
                let control = _mm_cmpeq_epi8(_mm_min_epu8(v, below_space), v);
                let special = _mm_or_si128(
                    _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                    control,
                );
                // The block's top bits, all 16 of them: bytes past a special one are
                // scanned again by the next call, so at worst this says "maybe".
                high |= _mm_movemask_epi8(v);
                let mask = _mm_movemask_epi8(special);
                if mask != 0 {
                    return (i + mask.trailing_zeros() as usize, high != 0);
                }
                i += 16;
            }
        }
    }
    let end = i + s[i..]
        .iter()
        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
        .unwrap_or(s.len() - i);
    (end, high != 0 || !s[i..end].is_ascii())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;

    /// What serde_json makes of a body, in the same terms (the reference).
    fn reference(body: &[u8]) -> Option<Messages> {
        let text = std::str::from_utf8(body).ok()?;
        let offset = |raw: &RawValue| {
            let start = raw.get().as_ptr() as usize - text.as_ptr() as usize;
            start..start + raw.get().len()
        };
        if text.trim_start().starts_with('[') {
            let items: Vec<&RawValue> = serde_json::from_str(text).ok()?;
            Some(Messages::Array(items.into_iter().map(offset).collect()))
        } else {
            let raw: &RawValue = serde_json::from_str(text).ok()?;
            Some(Messages::One(offset(raw)))
        }
    }

    #[test]
    fn plain_prefix_stops_at_the_first_special_byte_anywhere_in_a_block() {
        for len in 0..70 {
            let clean = vec![b'x'; len];
            assert_eq!(plain_prefix(&clean), (len, false));
            for at in 0..len {
                for special in [b'"', b'\\', 0x00, 0x1f] {
                    let mut s = clean.clone();
                    s[at] = special;
                    assert_eq!(plain_prefix(&s).0, at, "len {len}, {special:#x} at {at}");
                }
                // Bytes of multi-byte characters and DEL are plain; the former are
                // noted.
                let mut s = clean.clone();
                s[at] = 0x80 | (at as u8 & 0x3f);
                assert_eq!(plain_prefix(&s), (len, true), "len {len}, high at {at}");
                s[at] = 0x7f;
                assert_eq!(plain_prefix(&s), (len, false));
                // A high byte before a special one is always noted.
                if at + 1 < len {
                    let mut s = clean.clone();
                    s[at] = 0xc3;
                    s[at + 1] = b'"';
                    assert_eq!(plain_prefix(&s), (at + 1, true), "len {len}, at {at}");
                }
            }
        }
    }

    #[test]
    fn accepts_what_serde_json_accepts_with_the_same_spans() {
        let valid: &[&str] = &[
            "[]",
            " [ ] ",
            "[1]",
            "[1, 2 ,3]",
            "[\"a\",{\"k\":[true,false,null]}]",
            "{\"t\":1000000000000001,\"p\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}",
            "\"just a string\"",
            "-0",
            "0.5e-7",
            "[-12.25E+3, 0, 1e9]",
            " 7 ",
            "[\"esc \\\" \\\\ \\/ \\b \\f \\n \\r \\t\"]",
            "[\"naïve ☕ 𝄞\"]",
            "{}",
            "[[],{},[[]]]",
            "\t[\n1\r]\n",
        ];
        for body in valid {
            let found = messages(body.as_bytes());
            assert!(found.is_some(), "fast path refused {body:?}");
            assert_eq!(found, reference(body.as_bytes()), "{body:?}");
        }
    }

    #[test]
    fn refuses_what_serde_json_refuses() {
        let invalid: &[&str] = &[
            "",
            " ",
            "[",
            "]",
            "[1,]",
            "[,1]",
            "[1 2]",
            "{\"a\"}",
            "{\"a\":}",
            "{\"a\":1,}",
            "{a:1}",
            "01",
            "[01]",
            "1.",
            ".5",
            "1e",
            "1e+",
            "-",
            "--1",
            "+1",
            "tru",
            "truex",
            "nul",
            "[true false]",
            "\"unterminated",
            "\"bad \\x escape\"",
            "\"raw\ttab\"",
            "\"raw\nnewline\"",
            "1 2",
            "[1] x",
            "NaN",
            "[Infinity]",
            "'single'",
        ];
        for body in invalid {
            assert!(
                reference(body.as_bytes()).is_none(),
                "serde accepts {body:?}"
            );
            assert_eq!(messages(body.as_bytes()), None, "{body:?}");
        }
        // Left to serde_json (which accepts them): `\u` escapes and deep nesting.
        for body in [
            "[\"\\u00e9\"]",
            &format!("{}1{}", "[".repeat(70), "]".repeat(70)),
        ] {
            assert!(reference(body.as_bytes()).is_some());
            assert_eq!(messages(body.as_bytes()), None, "{body:?}");
        }
    }

    /// Random bodies near JSON: wherever the scanner answers, serde_json agrees, and
    /// for bodies built valid the scanner does answer (the fast path is taken).
    #[test]
    fn agrees_with_serde_json_on_random_bodies() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let pieces: &[&str] = &[
            "[", "]", "{", "}", ",", ":", " ", "\n", "\"", "\\", "\\\"", "\\n", "\\u", "a", "é",
            "0", "1", "-", ".", "e", "+", "true", "false", "null", "\"k\"", "\"v\"", "\t", "\u{1}",
            "[]", "{}", "12", "0.5", "\"s\"",
        ];
        let (mut fast, mut agreed) = (0, 0);
        for round in 0..40_000 {
            let body = if round % 2 == 0 {
                // Built valid: a random value, maybe mutated.
                let mut out = String::new();
                random_value(&mut rand, &mut out, 0);
                if round % 4 == 0 {
                    let at = rand(out.len() + 1);
                    let at = (0..=at)
                        .rev()
                        .find(|&i| out.is_char_boundary(i))
                        .unwrap_or(0);
                    out.insert_str(at, pieces[rand(pieces.len())]);
                }
                out
            } else {
                (0..rand(12)).map(|_| pieces[rand(pieces.len())]).collect()
            };
            let scanned = scan(body.as_bytes());
            let expected = reference(body.as_bytes());
            if let Some((found, ascii)) = scanned {
                fast += 1;
                assert_eq!(Some(found), expected, "{body:?}");
                // "All ASCII" must be true whenever said; it is said for ASCII bodies
                // (no block of them has a high bit).
                assert_eq!(ascii, body.is_ascii(), "{body:?}");
            }
            if expected.is_some() {
                agreed += 1;
            }
        }
        // Most valid bodies took the fast path.
        assert!(
            fast * 10 > agreed * 8,
            "fast path {fast} of {agreed} valid bodies"
        );
    }

    fn random_value(rand: &mut impl FnMut(usize) -> usize, out: &mut String, depth: u32) {
        let ws = [" ", "", "\n", "\t "];
        out.push_str(ws[rand(ws.len())]);
        match if depth > 4 { rand(5) } else { rand(7) } {
            0 => out.push_str(["true", "false", "null"][rand(3)]),
            1 => out.push_str(["0", "-1", "12.5", "3e7", "-0.25E-2", "1000000000000001"][rand(6)]),
            2 | 3 => {
                out.push('"');
                for _ in 0..rand(40) {
                    out.push_str(["x", "é", "\\\"", "\\\\", "\\n", "☕", " ", "/"][rand(8)]);
                }
                out.push('"');
            }
            4 => out.push_str("\"plain\""),
            5 => {
                out.push('[');
                for i in 0..rand(4) {
                    if i > 0 {
                        out.push(',');
                    }
                    random_value(rand, out, depth + 1);
                }
                out.push(']');
            }
            _ => {
                out.push('{');
                for i in 0..rand(4) {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&format!("\"k{i}\":"));
                    random_value(rand, out, depth + 1);
                }
                out.push('}');
            }
        }
        out.push_str(ws[rand(ws.len())]);
    }

    /// Bodies that are not UTF-8 are refused whichever path reads them, with the
    /// bytes inside a string the scanner passes over, in a 16-byte block or after one.
    #[test]
    fn bodies_that_are_not_utf8_are_refused() {
        for bad in [
            &b"[\"a\xff\"]"[..],
            b"{\"p\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\xc3\"}",
            b"{\"p\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\xed\xa0\x80xx\"}",
            b"\"\xf8\x88\x80\x80\x80\"",
        ] {
            let found = scan(bad);
            assert!(matches!(found, Some((_, false))), "{bad:?}: {found:?}");
            let err = crate::stream::json_records(&bytes::Bytes::copy_from_slice(bad), true)
                .expect_err("not UTF-8");
            assert!(err.to_string().contains("not UTF-8"), "{err}");
        }
        let ok = "{\"p\":\"naïve ☕ xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}";
        assert!(matches!(scan(ok.as_bytes()), Some((_, false))));
        let spans = crate::stream::json_records(&bytes::Bytes::from(ok), false).unwrap();
        assert_eq!(spans.len(), 1);
    }
}
