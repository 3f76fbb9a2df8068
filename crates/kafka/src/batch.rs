//! Kafka record batches (magic 2): decoding what producers send, with every
//! length checked and decompression bounded, and encoding what fetches return.
//!
//! ```text
//! batch  = base_offset:i64 length:i32 leader_epoch:i32 magic:i8 crc:u32
//!          attributes:i16 last_offset_delta:i32 base_ts:i64 max_ts:i64
//!          producer_id:i64 producer_epoch:i16 base_sequence:i32 count:i32 record*
//! record = length:varint attributes:i8 ts_delta:varlong offset_delta:varint
//!          key_len:varint key value_len:varint value header_count:varint
//!          (name_len:varint name value_len:varint value)*
//! ```
//!
//! The CRC-32C covers everything from `attributes` to the end. Compression
//! (attributes bits 0-2) applies to the records only.

use std::io::Read;

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Bytes before the records.
pub const HEADER_LEN: usize = 61;
/// Offset of `attributes`, where the CRC's coverage starts.
const CRC_START: usize = 21;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Codec {
    fn of(attributes: i16) -> Result<Codec, BatchError> {
        Ok(match attributes & 7 {
            0 => Codec::None,
            1 => Codec::Gzip,
            2 => Codec::Snappy,
            3 => Codec::Lz4,
            4 => Codec::Zstd,
            n => {
                return Err(BatchError::Invalid(format!(
                    "unknown compression codec {n}"
                )))
            }
        })
    }
}

#[derive(Debug, PartialEq)]
pub enum BatchError {
    /// Malformed: the protocol's CORRUPT_MESSAGE.
    Corrupt(String),
    /// Well formed but refused: INVALID_RECORD.
    Invalid(String),
    /// Over a limit: MESSAGE_TOO_LARGE.
    TooLarge(String),
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchError::Corrupt(m) | BatchError::Invalid(m) | BatchError::TooLarge(m) => {
                f.write_str(m)
            }
        }
    }
}

fn corrupt(m: &str) -> BatchError {
    BatchError::Corrupt(m.to_string())
}

/// One record as a producer sent it.
#[derive(Clone, Debug, PartialEq)]
pub struct KafkaRecord {
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(String, Option<Bytes>)>,
}

/// A decoded batch.
#[derive(Debug)]
pub struct Batch {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub transactional: bool,
    pub control: bool,
    pub records: Vec<KafkaRecord>,
}

/// What one batch may hold.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Records in a batch.
    pub records: usize,
    /// Bytes of the records once decompressed.
    pub decompressed_bytes: usize,
}

/// The single batch of a produce request's partition data.
pub fn decode_one(mut buf: Bytes, limits: Limits) -> Result<Batch, BatchError> {
    let batch = decode(&mut buf, limits)?;
    if buf.has_remaining() {
        return Err(BatchError::Invalid(
            "a produce request carries exactly one record batch per partition".into(),
        ));
    }
    Ok(batch)
}

fn decode(buf: &mut Bytes, limits: Limits) -> Result<Batch, BatchError> {
    if buf.remaining() < HEADER_LEN {
        return Err(corrupt("record batch shorter than its header"));
    }
    let whole = buf.clone();
    let _base_offset = buf.get_i64();
    let length = buf.get_i32();
    if length < (HEADER_LEN - 12) as i32 || length as usize > buf.remaining() {
        return Err(corrupt("record batch length does not match the bytes sent"));
    }
    let total = 12 + length as usize;
    let _leader_epoch = buf.get_i32();
    let magic = buf.get_i8();
    if magic != 2 {
        return Err(BatchError::Invalid(format!(
            "record batch magic {magic}: only magic 2 (Kafka 0.11 and later) is supported"
        )));
    }
    let crc = buf.get_u32();
    if crc32c::crc32c(&whole[CRC_START..total]) != crc {
        return Err(corrupt("record batch CRC does not match"));
    }
    let attributes = buf.get_i16();
    let codec = Codec::of(attributes)?;
    let _last_offset_delta = buf.get_i32();
    let base_ts = buf.get_i64();
    let _max_ts = buf.get_i64();
    let producer_id = buf.get_i64();
    let producer_epoch = buf.get_i16();
    let base_sequence = buf.get_i32();
    let count = buf.get_i32();
    if count < 0 || count as usize > limits.records {
        return Err(BatchError::TooLarge(format!(
            "a batch holds 0 to {} records, not {count}",
            limits.records
        )));
    }
    let body = whole.slice(HEADER_LEN..total);
    buf.advance(total - HEADER_LEN);
    let mut records = match codec {
        Codec::None => body,
        _ => decompress(codec, &body, limits.decompressed_bytes)?,
    };
    if records.len() > limits.decompressed_bytes {
        return Err(BatchError::TooLarge(format!(
            "the batch's records are over {} bytes",
            limits.decompressed_bytes
        )));
    }
    let mut out = Vec::with_capacity(count as usize);
    for _ in 0..count {
        out.push(record(&mut records, base_ts)?);
    }
    if records.has_remaining() {
        return Err(corrupt("bytes after the batch's last record"));
    }
    Ok(Batch {
        producer_id,
        producer_epoch,
        base_sequence,
        transactional: attributes & 0x10 != 0,
        control: attributes & 0x20 != 0,
        records: out,
    })
}

fn record(buf: &mut Bytes, base_ts: i64) -> Result<KafkaRecord, BatchError> {
    let len = varint(buf)?;
    if len < 0 || len as usize > buf.remaining() {
        return Err(corrupt("record length past the batch"));
    }
    let mut r = buf.split_to(len as usize);
    if !r.has_remaining() {
        return Err(corrupt("empty record"));
    }
    let _attributes = r.get_i8();
    let ts_delta = varlong(&mut r)?;
    let _offset_delta = varint(&mut r)?;
    let key = nullable(&mut r)?;
    let value = nullable(&mut r)?;
    let count = varint(&mut r)?;
    if count < 0 || count as usize > r.remaining() {
        return Err(corrupt("header count past the record"));
    }
    let mut headers = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let name = nullable(&mut r)?.ok_or_else(|| corrupt("null header name"))?;
        let name = String::from_utf8(name.to_vec())
            .map_err(|_| BatchError::Invalid("a header name is not UTF-8".into()))?;
        headers.push((name, nullable(&mut r)?));
    }
    if r.has_remaining() {
        return Err(corrupt("bytes after a record's headers"));
    }
    Ok(KafkaRecord {
        timestamp: base_ts.wrapping_add(ts_delta),
        key,
        value,
        headers,
    })
}

fn nullable(buf: &mut Bytes) -> Result<Option<Bytes>, BatchError> {
    let len = varint(buf)?;
    if len < 0 {
        return Ok(None);
    }
    if len as usize > buf.remaining() {
        return Err(corrupt("field length past the record"));
    }
    Ok(Some(buf.split_to(len as usize)))
}

fn varlong(buf: &mut Bytes) -> Result<i64, BatchError> {
    let mut raw: u64 = 0;
    for shift in (0..70).step_by(7) {
        if !buf.has_remaining() {
            return Err(corrupt("truncated varint"));
        }
        let b = buf.get_u8();
        if shift == 63 && b > 1 {
            return Err(corrupt("varint too long"));
        }
        raw |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok((raw >> 1) as i64 ^ -((raw & 1) as i64));
        }
    }
    Err(corrupt("varint too long"))
}

fn varint(buf: &mut Bytes) -> Result<i32, BatchError> {
    let v = varlong(buf)?;
    i32::try_from(v).map_err(|_| corrupt("varint out of range"))
}

/// Reads a decompressor to its end, refusing more than `max` bytes.
fn read_bounded(mut r: impl Read, max: usize) -> Result<Bytes, BatchError> {
    let mut out = Vec::new();
    let n = r
        .by_ref()
        .take(max as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| corrupt(&format!("compressed records do not decompress: {e}")))?;
    if n > max {
        return Err(BatchError::TooLarge(format!(
            "the batch's records decompress to over {max} bytes"
        )));
    }
    Ok(Bytes::from(out))
}

/// xerial's snappy framing, which the Java client writes: a magic header, then
/// blocks each prefixed with their compressed length.
const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\x00";

fn decompress(codec: Codec, data: &Bytes, max: usize) -> Result<Bytes, BatchError> {
    match codec {
        Codec::None => Ok(data.clone()),
        Codec::Gzip => read_bounded(flate2::read::MultiGzDecoder::new(&data[..]), max),
        Codec::Lz4 => read_bounded(lz4_flex::frame::FrameDecoder::new(&data[..]), max),
        Codec::Zstd => {
            let decoder = ruzstd::decoding::StreamingDecoder::new(&data[..])
                .map_err(|e| corrupt(&format!("zstd: {e}")))?;
            read_bounded(decoder, max)
        }
        Codec::Snappy => {
            if data.starts_with(XERIAL_MAGIC) && data.len() >= 16 {
                let mut rest = data.slice(16..);
                let mut out = BytesMut::new();
                while rest.has_remaining() {
                    if rest.remaining() < 4 {
                        return Err(corrupt("truncated snappy block length"));
                    }
                    let n = rest.get_u32() as usize;
                    if n > rest.remaining() {
                        return Err(corrupt("snappy block past the batch"));
                    }
                    let block = rest.split_to(n);
                    out.put(snappy_raw(&block, max - out.len().min(max))?);
                    if out.len() > max {
                        return Err(too_large(max));
                    }
                }
                Ok(out.freeze())
            } else {
                snappy_raw(data, max)
            }
        }
    }
}

fn too_large(max: usize) -> BatchError {
    BatchError::TooLarge(format!(
        "the batch's records decompress to over {max} bytes"
    ))
}

fn snappy_raw(data: &[u8], max: usize) -> Result<Bytes, BatchError> {
    let len = snap::raw::decompress_len(data).map_err(|e| corrupt(&format!("snappy: {e}")))?;
    if len > max {
        return Err(too_large(max));
    }
    let mut out = vec![0; len];
    snap::raw::Decoder::new()
        .decompress(data, &mut out)
        .map_err(|e| corrupt(&format!("snappy: {e}")))?;
    Ok(Bytes::from(out))
}

/// A record for a fetch response.
pub struct OutRecord<'a> {
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: &'a [(String, Bytes)],
}

/// Appends one uncompressed batch of `records` (offsets ascending) to `out`.
pub fn encode(out: &mut BytesMut, records: &[OutRecord<'_>]) {
    let Some(first) = records.first() else {
        return;
    };
    let base_offset = first.offset;
    let base_ts = records.iter().map(|r| r.timestamp).min().unwrap_or(0);
    let max_ts = records.iter().map(|r| r.timestamp).max().unwrap_or(0);
    let start = out.len();
    out.put_i64(base_offset);
    out.put_i32(0); // length, set below
    out.put_i32(-1); // partition leader epoch
    out.put_i8(2);
    out.put_u32(0); // crc, set below
    out.put_i16(0); // attributes: no compression, create time
    out.put_i32((records[records.len() - 1].offset - base_offset) as i32);
    out.put_i64(base_ts);
    out.put_i64(max_ts);
    out.put_i64(-1); // producer id
    out.put_i16(-1);
    out.put_i32(-1);
    out.put_i32(records.len() as i32);
    let mut body = Vec::new();
    for r in records {
        body.clear();
        body.put_i8(0);
        put_varlong(&mut body, r.timestamp - base_ts);
        put_varlong(&mut body, r.offset - base_offset);
        put_nullable(&mut body, r.key);
        put_nullable(&mut body, r.value);
        put_varlong(&mut body, r.headers.len() as i64);
        for (name, value) in r.headers {
            put_nullable(&mut body, Some(name.as_bytes()));
            put_nullable(&mut body, Some(value));
        }
        put_varlong(out, body.len() as i64);
        out.put_slice(&body);
    }
    let length = (out.len() - start - 12) as i32;
    out[start + 8..start + 12].copy_from_slice(&length.to_be_bytes());
    let crc = crc32c::crc32c(&out[start + CRC_START..]);
    out[start + 17..start + 21].copy_from_slice(&crc.to_be_bytes());
}

fn put_nullable(out: &mut impl BufMut, v: Option<&[u8]>) {
    match v {
        None => put_varlong(out, -1),
        Some(v) => {
            put_varlong(out, v.len() as i64);
            out.put_slice(v);
        }
    }
}

fn put_varlong(out: &mut impl BufMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    out.put_u8(z as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const LIMITS: Limits = Limits {
        records: 10_000,
        decompressed_bytes: 1 << 20,
    };

    fn sample() -> Vec<(String, Bytes)> {
        vec![
            ("trace".into(), Bytes::from_static(b"abc")),
            ("trace".into(), Bytes::from_static(&[0, 255])),
        ]
    }

    fn encoded(n: i64) -> Bytes {
        let headers = sample();
        let values: Vec<Vec<u8>> = (0..n).map(|i| format!("value {i}").into_bytes()).collect();
        let records: Vec<OutRecord<'_>> = (0..n)
            .map(|i| OutRecord {
                offset: 100 + i,
                timestamp: 1_700_000_000_000 + i,
                key: (i % 2 == 0).then_some(&b"k"[..]),
                value: (i != 1).then_some(&values[i as usize][..]),
                headers: &headers,
            })
            .collect();
        let mut out = BytesMut::new();
        encode(&mut out, &records);
        out.freeze()
    }

    #[test]
    fn an_encoded_batch_decodes_to_its_records() {
        let batch = decode_one(encoded(5), LIMITS).unwrap();
        assert_eq!(batch.records.len(), 5);
        let r = &batch.records[0];
        assert_eq!(r.timestamp, 1_700_000_000_000);
        assert_eq!(r.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(r.value.as_deref(), Some(&b"value 0"[..]));
        assert_eq!(
            r.headers,
            vec![
                ("trace".into(), Some(Bytes::from_static(b"abc"))),
                ("trace".into(), Some(Bytes::from_static(&[0, 255]))),
            ]
        );
        assert_eq!(batch.records[1].value, None);
        assert_eq!(batch.records[1].key, None);
        assert_eq!(batch.records[4].timestamp, 1_700_000_000_004);
    }

    /// The records of `plain` compressed with `codec`, as a producer would send them.
    fn compressed(plain: &Bytes, codec: Codec, compress: impl Fn(&[u8]) -> Vec<u8>) -> Bytes {
        let records = compress(&plain[HEADER_LEN..]);
        let mut out = BytesMut::from(&plain[..HEADER_LEN]);
        out.put_slice(&records);
        let length = (out.len() - 12) as i32;
        out[8..12].copy_from_slice(&length.to_be_bytes());
        let attributes = match codec {
            Codec::None => 0i16,
            Codec::Gzip => 1,
            Codec::Snappy => 2,
            Codec::Lz4 => 3,
            Codec::Zstd => 4,
        };
        out[21..23].copy_from_slice(&attributes.to_be_bytes());
        let crc = crc32c::crc32c(&out[CRC_START..]);
        out[17..21].copy_from_slice(&crc.to_be_bytes());
        out.freeze()
    }

    type Compress = fn(&[u8]) -> Vec<u8>;

    fn gzip(b: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    }
    fn lz4(b: &[u8]) -> Vec<u8> {
        let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    }
    fn zstd(b: &[u8]) -> Vec<u8> {
        ruzstd::encoding::compress_to_vec(b, ruzstd::encoding::CompressionLevel::Fastest)
    }
    fn snappy(b: &[u8]) -> Vec<u8> {
        snap::raw::Encoder::new().compress_vec(b).unwrap()
    }
    fn xerial(b: &[u8]) -> Vec<u8> {
        let mut out = XERIAL_MAGIC.to_vec();
        out.extend_from_slice(&1i32.to_be_bytes());
        out.extend_from_slice(&1i32.to_be_bytes());
        for block in b.chunks(7) {
            let c = snappy(block);
            out.extend_from_slice(&(c.len() as u32).to_be_bytes());
            out.extend_from_slice(&c);
        }
        out
    }

    #[test]
    fn every_codec_decodes() {
        let plain = encoded(20);
        let want = decode_one(plain.clone(), LIMITS).unwrap().records;
        let codecs: [(Codec, Compress); 5] = [
            (Codec::Gzip, gzip),
            (Codec::Lz4, lz4),
            (Codec::Zstd, zstd),
            (Codec::Snappy, snappy),
            (Codec::Snappy, xerial),
        ];
        for (codec, f) in codecs {
            let batch = compressed(&plain, codec, f);
            let got = decode_one(batch, LIMITS).unwrap_or_else(|e| panic!("{codec:?}: {e}"));
            assert_eq!(got.records, want, "{codec:?}");
        }
    }

    #[test]
    fn a_decompression_bomb_is_refused() {
        // 200 records of 64 KiB zeros: 13 MiB decompressed from a few KiB.
        let zeros = vec![0u8; 64 << 10];
        let headers = vec![];
        let records: Vec<OutRecord<'_>> = (0..200)
            .map(|i| OutRecord {
                offset: i,
                timestamp: 0,
                key: None,
                value: Some(&zeros),
                headers: &headers,
            })
            .collect();
        let mut out = BytesMut::new();
        encode(&mut out, &records);
        let plain = out.freeze();
        let codecs: [(Codec, Compress); 4] = [
            (Codec::Gzip, gzip),
            (Codec::Lz4, lz4),
            (Codec::Zstd, zstd),
            (Codec::Snappy, snappy),
        ];
        for (codec, f) in codecs {
            let batch = compressed(&plain, codec, f);
            assert!(batch.len() < 1 << 20, "{codec:?}: {}", batch.len());
            assert!(
                matches!(decode_one(batch, LIMITS), Err(BatchError::TooLarge(_))),
                "{codec:?}"
            );
        }
    }

    #[test]
    fn damaged_batches_are_refused_not_panicked_on() {
        let good = encoded(3);
        // Every truncation, and every single-byte change, is an error or (for a
        // change the CRC does not cover) a batch; never a panic.
        for n in 0..good.len() {
            assert!(decode_one(good.slice(..n), LIMITS).is_err());
        }
        for i in 0..good.len() {
            for v in [0u8, 0x7f, 0x80, 0xff] {
                let mut b = good.to_vec();
                b[i] = v;
                let _ = decode_one(Bytes::from(b), LIMITS);
            }
        }
        // A CRC-valid batch whose record lengths lie.
        let mut b = good.to_vec();
        b[HEADER_LEN] = 0x7e; // first record's length: 63, past the end
        let crc = crc32c::crc32c(&b[CRC_START..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            decode_one(Bytes::from(b), LIMITS),
            Err(BatchError::Corrupt(_))
        ));
        // Two batches in one partition's data.
        let mut two = good.to_vec();
        two.extend_from_slice(&good);
        assert!(matches!(
            decode_one(Bytes::from(two), LIMITS),
            Err(BatchError::Invalid(_))
        ));
        // More records than the limit.
        let few = Limits {
            records: 2,
            decompressed_bytes: 1 << 20,
        };
        assert!(matches!(
            decode_one(good, few),
            Err(BatchError::TooLarge(_))
        ));
    }

    #[test]
    fn varints_round_trip_at_their_edges() {
        for v in [
            0i64,
            1,
            -1,
            63,
            -64,
            64,
            i32::MAX as i64,
            i32::MIN as i64,
            i64::MAX,
            i64::MIN,
        ] {
            let mut b = Vec::new();
            put_varlong(&mut b, v);
            assert_eq!(varlong(&mut Bytes::from(b)).unwrap(), v);
        }
        assert!(varlong(&mut Bytes::from_static(&[0xff; 11])).is_err());
    }
}
