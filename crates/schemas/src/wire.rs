//! The Confluent wire framing of a payload written with a registered schema: byte
//! 0, the schema id (4 bytes, big-endian), then for Protobuf the path of the
//! message type in its file (a count, then that many indexes, zig-zag varints; a
//! single 0 byte stands for `[0]`, the first message), then the datum.

/// A framed payload, taken apart.
#[derive(Debug, PartialEq, Eq)]
pub struct Framed<'a> {
    pub schema_id: u32,
    /// Protobuf only: the message type's path (`[0]`: the file's first message).
    pub message_path: Vec<usize>,
    pub datum: &'a [u8],
}

/// Message paths longer than this are refused (clients cap them far higher, but
/// no file nests messages this deep).
const PATH_MAX: usize = 64;

/// Splits a framed payload; `protobuf` says whether a message path follows the id.
pub fn unframe(payload: &[u8], protobuf: bool) -> Result<Framed<'_>, String> {
    let (&magic, rest) = payload.split_first().ok_or("an empty payload")?;
    if magic != 0 {
        return Err(format!(
            "the payload starts with byte {magic}, not 0: it is not framed with a schema id"
        ));
    }
    if rest.len() < 4 {
        return Err("the payload ends inside its schema id".into());
    }
    let schema_id = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
    let mut at = 4;
    let mut message_path = Vec::new();
    if protobuf {
        let count = zigzag(rest, &mut at)?;
        if count == 0 {
            message_path.push(0);
        } else {
            if !(1..=PATH_MAX as i64).contains(&count) {
                return Err(format!("a message path of {count} indexes"));
            }
            for _ in 0..count {
                let i = zigzag(rest, &mut at)?;
                let i = usize::try_from(i).map_err(|_| format!("a message index of {i}"))?;
                message_path.push(i);
            }
        }
    }
    Ok(Framed {
        schema_id,
        message_path,
        datum: &rest[at..],
    })
}

fn zigzag(bytes: &[u8], at: &mut usize) -> Result<i64, String> {
    let mut v: u64 = 0;
    for i in 0..10 {
        let b = *bytes
            .get(*at)
            .ok_or("the payload ends inside its message path")?;
        *at += 1;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok((v >> 1) as i64 ^ -((v & 1) as i64));
        }
    }
    Err("a varint longer than 10 bytes in the message path".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_come_apart() {
        let f = unframe(&[0, 0, 0, 1, 2, 9, 9], false).unwrap();
        assert_eq!((f.schema_id, f.datum), (258, &[9, 9][..]));
        assert!(f.message_path.is_empty());
        // Protobuf: a lone 0 is the first message; [1, 0] is message 1's first nested.
        let f = unframe(&[0, 0, 0, 0, 7, 0, 8], true).unwrap();
        assert_eq!(
            (f.schema_id, f.message_path, f.datum),
            (7, vec![0], &[8][..])
        );
        let f = unframe(&[0, 0, 0, 0, 7, 4, 2, 0, 8], true).unwrap();
        assert_eq!((f.message_path, f.datum), (vec![1, 0], &[8][..]));
    }

    #[test]
    fn bad_frames_say_why() {
        for (bytes, protobuf, says) in [
            (&[][..], false, "empty"),
            (&[1, 0, 0, 0, 1][..], false, "not 0"),
            (&[0, 0, 0][..], false, "inside its schema id"),
            (&[0, 0, 0, 0, 1][..], true, "inside its message path"),
            (&[0, 0, 0, 0, 1, 3][..], true, "of -2 indexes"),
            (&[0, 0, 0, 0, 1, 0xfe, 0x01][..], true, "of 127 indexes"),
            (&[0, 0, 0, 0, 1, 2, 3][..], true, "index of -2"),
            (
                &[
                    0, 0, 0, 0, 1, 2, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                ][..],
                true,
                "longer than 10",
            ),
        ] {
            let err = unframe(bytes, protobuf).unwrap_err();
            assert!(err.contains(says), "{bytes:?}: {err}");
        }
    }
}
