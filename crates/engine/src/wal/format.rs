//! The WAL object format: the one place that encodes and decodes what goes into the
//! object store.
//!
//! ```text
//! object  = header chunk*
//! header  = "PMQW" version:u8 epoch:u64 seq:u64 chunk_count:u32
//! chunk   = body_len:u32 crc32c(body):u32 body          (one chunk per stream per flush)
//! body    = stream_id:u64 op_count:u32 op*
//! op      = tag:u8 ...                                   (see `Op`)
//! ```
//! All integers are little-endian. A chunk carries everything needed to replay it on
//! its own (stream id, offsets, producer stamps, lifecycle), so a reader fetches one
//! stream's bytes with one ranged GET and recovery needs nothing but the objects.

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::offset::Offset;

pub const MAGIC: &[u8; 4] = b"PMQW";
pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 4 + 1 + 8 + 8 + 4;
pub const CHUNK_HEADER_LEN: usize = 8;
/// Content of the object that seals an abandoned WAL position (see `wal::recovery`).
pub const SEAL_MAGIC: &[u8; 4] = b"PMQS";

const TAG_CREATE: u8 = 1;
const TAG_APPEND: u8 = 2;
const TAG_DELETE: u8 = 3;
const TAG_TRIM: u8 = 4;
const TAG_SET_RETENTION: u8 = 5;
const TAG_RELOCATE: u8 = 6;
const TAG_PUT_TOKEN: u8 = 7;
const TAG_REVOKE_TOKENS: u8 = 8;
const TAG_PUT_SERVER_KEY: u8 = 9;
/// `Relocate` with the span's first sequence number (tag 6 is read as starting at 0).
const TAG_RELOCATE_SEQ: u8 = 10;
const TAG_REGISTRY_PUT: u8 = 11;
const TAG_REGISTRY_DELETE: u8 = 12;
/// Append flag: the op carries its first record's sequence number (appends logged
/// before sequence numbers existed number from 0).
const APPEND_HAS_SEQ: u8 = 8;
/// Fork marker with the fork point's sequence number (marker 1: none, read as 0).
const FORK_WITH_SEQ: u8 = 2;

/// Record flag: this record starts a new append (a JSON batch spans several records).
pub const RECORD_BATCH_START: u8 = 1;
/// Record flag: the record carries an extension after its data ([`RecordExt`]: the
/// native API's headers and client timestamp).
pub const RECORD_EXT: u8 = 2;

#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// Server-assigned, per-stream monotonic timestamp (ms since the Unix epoch).
    pub ts_ms: u64,
    pub flags: u8,
    pub data: Bytes,
    /// An encoded [`RecordExt`] (present exactly when `flags` has [`RECORD_EXT`]).
    /// It is not part of the stream's bytes: offsets count `data` only.
    pub ext: Option<Bytes>,
}

impl Record {
    /// A record without extension.
    pub fn plain(ts_ms: u64, flags: u8, data: Bytes) -> Record {
        Record {
            ts_ms,
            flags,
            data,
            ext: None,
        }
    }

    /// Bytes the record holds in memory (data and extension).
    pub fn held_bytes(&self) -> usize {
        self.data.len() + self.ext.as_ref().map_or(0, Bytes::len)
    }
}

/// What the native record API and Kafka keep with a record besides its body:
///
/// ```text
/// ext  = client_ts:u64 (u64::MAX: none) header_count:u32 (name_len:u16 name value_len:u32 value)* [tail]
/// tail = flags:u8 (bit 0: a key follows, bit 1: the value is null, bit 2: the
///        value is empty) [key_len:u32 key]
/// ```
///
/// The tail is written only when there is a key or a null or empty value, so
/// records written before it existed decode unchanged (no key, a value).
///
/// A record's bytes are never empty (an empty record would share its offset with
/// the next and be unreadable at the tail): a Kafka record whose value is null or
/// empty is stored with a placeholder (`null` on a JSON stream, one zero byte
/// otherwise) and the flag that says what the value really is.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecordExt {
    pub client_ts_ms: Option<u64>,
    /// Name/value pairs in order; names may repeat.
    pub headers: Vec<(String, Bytes)>,
    /// A Kafka record's key.
    pub key: Option<Bytes>,
    /// A Kafka record whose value is null (a tombstone): its bytes are a placeholder.
    pub null_value: bool,
    /// A Kafka record whose value is empty: its bytes are a placeholder.
    pub empty_value: bool,
}

const EXT_KEY: u8 = 1;
const EXT_NULL_VALUE: u8 = 2;
const EXT_EMPTY_VALUE: u8 = 4;

impl RecordExt {
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(
            12 + self
                .headers
                .iter()
                .map(|(n, v)| 6 + n.len() + v.len())
                .sum::<usize>(),
        );
        out.put_u64_le(self.client_ts_ms.unwrap_or(u64::MAX));
        out.put_u32_le(self.headers.len() as u32);
        for (name, value) in &self.headers {
            out.put_u16_le(name.len() as u16);
            out.put_slice(name.as_bytes());
            out.put_u32_le(value.len() as u32);
            out.put_slice(value);
        }
        if self.key.is_some() || self.null_value || self.empty_value {
            let mut flags = 0;
            if self.key.is_some() {
                flags |= EXT_KEY;
            }
            if self.null_value {
                flags |= EXT_NULL_VALUE;
            }
            if self.empty_value {
                flags |= EXT_EMPTY_VALUE;
            }
            out.put_u8(flags);
            if let Some(key) = &self.key {
                out.put_u32_le(key.len() as u32);
                out.put_slice(key);
            }
        }
        out.freeze()
    }

    pub fn decode(ext: &Bytes) -> Result<RecordExt, FormatError> {
        let mut r = Reader {
            buf: ext.clone(),
            pos: 0,
        };
        let ts = r.u64()?;
        let count = r.u32()? as usize;
        let mut headers = Vec::with_capacity(count.min(64));
        for _ in 0..count {
            let len = r.take(2)?.get_u16_le() as usize;
            let name = String::from_utf8(r.take(len)?.to_vec())
                .map_err(|_| FormatError("header name is not UTF-8"))?;
            headers.push((name, r.bytes()?));
        }
        let (mut key, mut flags) = (None, 0);
        if r.pos < r.buf.len() {
            flags = r.u8()?;
            if flags & !(EXT_KEY | EXT_NULL_VALUE | EXT_EMPTY_VALUE) != 0 {
                return Err(FormatError("unknown record extension flags"));
            }
            if flags & EXT_KEY != 0 {
                key = Some(r.bytes()?);
            }
        }
        Ok(RecordExt {
            client_ts_ms: (ts != u64::MAX).then_some(ts),
            headers,
            key,
            null_value: flags & EXT_NULL_VALUE != 0,
            empty_value: flags & EXT_EMPTY_VALUE != 0,
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ProducerStamp {
    pub id: String,
    pub epoch: u64,
    pub seq: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ForkOrigin {
    pub source_id: u64,
    /// Where the fork's own data begins (the resolved divergence point).
    pub point: Offset,
    /// The sequence number of the fork's first own record (its source's at `point`).
    pub point_seq: u64,
    /// What the client asked for, kept for idempotent re-creation checks.
    pub requested_offset: Option<Offset>,
    pub sub_offset: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CreateOp {
    pub name: String,
    pub content_type: String,
    pub created_ms: u64,
    pub ttl_secs: Option<u64>,
    pub expires_at: Option<String>,
    pub fork: Option<ForkOrigin>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct AppendOp {
    pub start: Offset,
    /// Sequence number of the first record (records are numbered densely per stream).
    pub start_seq: u64,
    /// Shared, not copied, by everything that holds the op after the WAL (the
    /// tail cache's listeners, the indexer, the packer's runs): a clone of the op
    /// is one reference count, whatever the number of records.
    pub records: Arc<Vec<Record>>,
    pub close: bool,
    pub producer: Option<ProducerStamp>,
    pub stream_seq: Option<String>,
}

impl AppendOp {
    pub fn end(&self) -> Offset {
        self.start
            .advance(self.records.iter().map(|r| r.data.len() as u64).sum())
    }

    /// The sequence number after the last record.
    pub fn end_seq(&self) -> u64 {
        self.start_seq + self.records.len() as u64
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Create(CreateOp),
    Append(AppendOp),
    /// `soft`: the stream stays readable for its forks but is gone to clients.
    Delete {
        soft: bool,
    },
    /// Compaction moved a stream's data: written in the system chunk (stream id
    /// [`SYSTEM_STREAM`]), so replaying the log reproduces every index change.
    Relocate(RelocateOp),
    /// Records below `before` are no longer retained: reads there answer 410 and
    /// index rows that end at or below it go (their bytes with GC or compaction).
    /// Applying it never moves a stream's start backwards or past its tail.
    Trim {
        before: Offset,
    },
    /// Age retention in seconds (`None`: keep everything); a background pass trims
    /// what is older.
    SetRetention {
        secs: Option<u64>,
    },
    /// An access token was created, or replaced (the bootstrap token's rotation).
    /// System chunk only, like the two below: the metadata of the whole node.
    PutToken(TokenRecord),
    /// Tokens revoked at `at_ms` (those already revoked keep their time).
    RevokeTokens {
        ids: Vec<String>,
        at_ms: u64,
    },
    /// A server key (the read-token signing key), created once: the first one
    /// logged under a name wins.
    PutServerKey {
        name: String,
        key: Bytes,
    },
    /// A schema registry row (`docs/schemas.md`): `table` names its kind, `value`
    /// is its JSON. With `replace` false an existing row is left alone (ids and
    /// versions are written once; a late replay must not overwrite them).
    RegistryPut {
        table: String,
        key: String,
        value: String,
        replace: bool,
    },
    /// A schema registry row removed (a hard delete, a config or binding cleared).
    RegistryDelete {
        table: String,
        key: String,
    },
}

/// One access token as stored: never the secret, only its SHA-256. What a token
/// means (scopes, namespaces) is the HTTP edge's business.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRecord {
    pub id: String,
    pub secret_hash: Vec<u8>,
    /// The token that issued this one (`None` for the bootstrap token).
    pub parent_id: Option<String>,
    pub description: String,
    /// The scopes in their text form (`read,append:orders/**`), one per line.
    pub scopes: String,
    /// Prepended to every stream name the token addresses; empty for none.
    pub namespace: String,
    pub created_ms: u64,
    pub expires_ms: Option<u64>,
    pub revoked_ms: Option<u64>,
}

/// Chunks of this stream id hold node-level ops (relocations, tokens, server keys),
/// not a stream's.
pub const SYSTEM_STREAM: u64 = 0;

/// "The records of `stream_id` in `[start, end)` now live in `object_key` at
/// `byte_range` (one chunk)": replaces the index rows starting in that span.
#[derive(Clone, Debug, PartialEq)]
pub struct RelocateOp {
    pub stream_id: u64,
    pub start: Offset,
    pub end: Offset,
    pub object_key: String,
    pub byte_range: std::ops::Range<u64>,
    /// Timestamp of the last record in the span (for age retention).
    pub last_ts_ms: u64,
    /// Sequence number of the span's first record.
    pub start_seq: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("corrupt WAL data: {0}")]
pub struct FormatError(pub &'static str);

pub fn encode_header(out: &mut BytesMut, epoch: u64, seq: u64, chunk_count: u32) {
    out.put_slice(MAGIC);
    out.put_u8(VERSION);
    out.put_u64_le(epoch);
    out.put_u64_le(seq);
    out.put_u32_le(chunk_count);
}

/// Appends one chunk (a stream's ops of this flush); returns its byte range in `out`.
pub fn encode_chunk<'a>(
    out: &mut BytesMut,
    stream_id: u64,
    ops: impl Iterator<Item = &'a Op> + Clone,
) -> std::ops::Range<usize> {
    let start = out.len();
    out.put_u32_le(0); // body length, patched below
    out.put_u32_le(0); // crc, patched below
    let body_start = out.len();
    out.put_u64_le(stream_id);
    out.put_u32_le(ops.clone().count() as u32);
    for op in ops {
        encode_op(out, op);
    }
    let body_len = (out.len() - body_start) as u32;
    let crc = crc32c::crc32c(&out[body_start..]);
    out[start..start + 4].copy_from_slice(&body_len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    start..out.len()
}

fn put_str(out: &mut BytesMut, s: &str) {
    out.put_u32_le(s.len() as u32);
    out.put_slice(s.as_bytes());
}

fn put_opt_u64(out: &mut BytesMut, v: Option<u64>) {
    match v {
        Some(v) => {
            out.put_u8(1);
            out.put_u64_le(v);
        }
        None => out.put_u8(0),
    }
}

fn encode_op(out: &mut BytesMut, op: &Op) {
    match op {
        Op::Create(c) => {
            out.put_u8(TAG_CREATE);
            put_str(out, &c.name);
            put_str(out, &c.content_type);
            out.put_u64_le(c.created_ms);
            put_opt_u64(out, c.ttl_secs);
            put_str(out, c.expires_at.as_deref().unwrap_or(""));
            match &c.fork {
                Some(f) => {
                    out.put_u8(FORK_WITH_SEQ);
                    out.put_u64_le(f.source_id);
                    out.put_u64_le(f.point.0);
                    put_opt_u64(out, f.requested_offset.map(|o| o.0));
                    out.put_u64_le(f.sub_offset);
                    out.put_u64_le(f.point_seq);
                }
                None => out.put_u8(0),
            }
        }
        Op::Append(a) => {
            out.put_u8(TAG_APPEND);
            out.put_u64_le(a.start.0);
            let flags = (a.close as u8)
                | ((a.producer.is_some() as u8) << 1)
                | ((a.stream_seq.is_some() as u8) << 2)
                | APPEND_HAS_SEQ;
            out.put_u8(flags);
            if let Some(p) = &a.producer {
                put_str(out, &p.id);
                out.put_u64_le(p.epoch);
                out.put_u64_le(p.seq);
            }
            if let Some(s) = &a.stream_seq {
                put_str(out, s);
            }
            out.put_u64_le(a.start_seq);
            out.put_u32_le(a.records.len() as u32);
            for r in a.records.iter() {
                out.put_u64_le(r.ts_ms);
                debug_assert_eq!(r.flags & RECORD_EXT != 0, r.ext.is_some());
                out.put_u8(r.flags);
                out.put_u32_le(r.data.len() as u32);
                out.put_slice(&r.data);
                if let Some(ext) = &r.ext {
                    put_bytes(out, ext);
                }
            }
        }
        Op::Delete { soft } => {
            out.put_u8(TAG_DELETE);
            out.put_u8(*soft as u8);
        }
        Op::Relocate(r) => {
            out.put_u8(TAG_RELOCATE_SEQ);
            out.put_u64_le(r.stream_id);
            out.put_u64_le(r.start.0);
            out.put_u64_le(r.end.0);
            put_str(out, &r.object_key);
            out.put_u64_le(r.byte_range.start);
            out.put_u64_le(r.byte_range.end);
            out.put_u64_le(r.last_ts_ms);
            out.put_u64_le(r.start_seq);
        }
        Op::Trim { before } => {
            out.put_u8(TAG_TRIM);
            out.put_u64_le(before.0);
        }
        Op::SetRetention { secs } => {
            out.put_u8(TAG_SET_RETENTION);
            put_opt_u64(out, *secs);
        }
        Op::PutToken(t) => {
            out.put_u8(TAG_PUT_TOKEN);
            put_str(out, &t.id);
            put_bytes(out, &t.secret_hash);
            put_str(out, t.parent_id.as_deref().unwrap_or(""));
            put_str(out, &t.description);
            put_str(out, &t.scopes);
            put_str(out, &t.namespace);
            out.put_u64_le(t.created_ms);
            put_opt_u64(out, t.expires_ms);
            put_opt_u64(out, t.revoked_ms);
        }
        Op::RevokeTokens { ids, at_ms } => {
            out.put_u8(TAG_REVOKE_TOKENS);
            out.put_u64_le(*at_ms);
            out.put_u32_le(ids.len() as u32);
            for id in ids {
                put_str(out, id);
            }
        }
        Op::PutServerKey { name, key } => {
            out.put_u8(TAG_PUT_SERVER_KEY);
            put_str(out, name);
            put_bytes(out, key);
        }
        Op::RegistryPut {
            table,
            key,
            value,
            replace,
        } => {
            out.put_u8(TAG_REGISTRY_PUT);
            put_str(out, table);
            put_str(out, key);
            put_str(out, value);
            out.put_u8(*replace as u8);
        }
        Op::RegistryDelete { table, key } => {
            out.put_u8(TAG_REGISTRY_DELETE);
            put_str(out, table);
            put_str(out, key);
        }
    }
}

fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    out.put_u32_le(b.len() as u32);
    out.put_slice(b);
}

/// Bytes an op adds to an object, for buffer accounting.
pub fn encoded_len(op: &Op) -> usize {
    match op {
        Op::Create(c) => {
            64 + c.name.len() + c.content_type.len() + c.expires_at.as_ref().map_or(0, |s| s.len())
        }
        Op::Append(a) => {
            40 + a.producer.as_ref().map_or(0, |p| p.id.len() + 20)
                + a.stream_seq.as_ref().map_or(0, |s| s.len() + 4)
                + a.records
                    .iter()
                    .map(|r| 13 + r.data.len() + r.ext.as_ref().map_or(0, |e| 4 + e.len()))
                    .sum::<usize>()
        }
        Op::Delete { .. } => 2,
        Op::Relocate(r) => 61 + r.object_key.len(),
        Op::Trim { .. } => 9,
        Op::SetRetention { secs } => 2 + secs.map_or(0, |_| 8),
        Op::PutToken(t) => {
            64 + t.id.len()
                + t.secret_hash.len()
                + t.parent_id.as_ref().map_or(0, String::len)
                + t.description.len()
                + t.scopes.len()
                + t.namespace.len()
        }
        Op::RevokeTokens { ids, .. } => 13 + ids.iter().map(|i| i.len() + 4).sum::<usize>(),
        Op::PutServerKey { name, key } => 9 + name.len() + key.len(),
        Op::RegistryPut {
            table, key, value, ..
        } => 14 + table.len() + key.len() + value.len(),
        Op::RegistryDelete { table, key } => 9 + table.len() + key.len(),
    }
}

pub struct ObjectHeader {
    pub epoch: u64,
    pub seq: u64,
    pub chunk_count: u32,
}

pub fn decode_header(object: &Bytes) -> Result<ObjectHeader, FormatError> {
    if object.len() < HEADER_LEN || &object[..4] != MAGIC {
        return Err(FormatError("bad object header"));
    }
    if object[4] != VERSION {
        return Err(FormatError("unknown WAL version"));
    }
    let mut b = &object[5..HEADER_LEN];
    Ok(ObjectHeader {
        epoch: b.get_u64_le(),
        seq: b.get_u64_le(),
        chunk_count: b.get_u32_le(),
    })
}

/// A decoded chunk: its stream, its ops, and where it sits in the object.
pub struct Chunk {
    pub stream_id: u64,
    pub ops: Vec<Op>,
    pub range: std::ops::Range<usize>,
}

/// Decodes every chunk of a whole object.
pub fn decode_object(object: &Bytes) -> Result<(ObjectHeader, Vec<Chunk>), FormatError> {
    let header = decode_header(object)?;
    let mut pos = HEADER_LEN;
    let mut chunks = Vec::with_capacity(header.chunk_count as usize);
    for _ in 0..header.chunk_count {
        let len = chunk_len(object, pos)?;
        let (stream_id, ops) = decode_chunk(&object.slice(pos..pos + len))?;
        chunks.push(Chunk {
            stream_id,
            ops,
            range: pos..pos + len,
        });
        pos += len;
    }
    Ok((header, chunks))
}

fn chunk_len(object: &Bytes, pos: usize) -> Result<usize, FormatError> {
    if object.len() < pos + CHUNK_HEADER_LEN {
        return Err(FormatError("truncated chunk header"));
    }
    let body_len = u32::from_le_bytes(object[pos..pos + 4].try_into().expect("4 bytes")) as usize;
    let len = CHUNK_HEADER_LEN + body_len;
    if object.len() < pos + len {
        return Err(FormatError("truncated chunk"));
    }
    Ok(len)
}

/// Decodes one chunk (header included), verifying its checksum. Record payloads are
/// zero-copy slices of `chunk`.
pub fn decode_chunk(chunk: &Bytes) -> Result<(u64, Vec<Op>), FormatError> {
    verify_chunk(chunk)?;
    decode_verified_chunk(chunk)
}

/// Checks one chunk's length and checksum (what [`decode_chunk`] checks first).
pub fn verify_chunk(chunk: &[u8]) -> Result<(), FormatError> {
    if chunk.len() < CHUNK_HEADER_LEN + 12 {
        return Err(FormatError("chunk too short"));
    }
    let body_len = u32::from_le_bytes(chunk[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(chunk[4..8].try_into().expect("4 bytes"));
    if chunk.len() != CHUNK_HEADER_LEN + body_len {
        return Err(FormatError("chunk length mismatch"));
    }
    if crc32c::crc32c(&chunk[CHUNK_HEADER_LEN..]) != crc {
        return Err(FormatError("chunk checksum mismatch"));
    }
    Ok(())
}

/// Decodes a chunk already checked by [`verify_chunk`] (the block cache holds only
/// such chunks, so a cache hit is not checksummed again). Its structure is still
/// parsed defensively: a malformed op is an error, never a panic.
pub fn decode_verified_chunk(chunk: &Bytes) -> Result<(u64, Vec<Op>), FormatError> {
    if chunk.len() < CHUNK_HEADER_LEN + 12 {
        return Err(FormatError("chunk too short"));
    }
    let body = chunk.slice(CHUNK_HEADER_LEN..);
    let mut r = Reader { buf: body, pos: 0 };
    let stream_id = r.u64()?;
    let count = r.u32()? as usize;
    let mut ops = Vec::with_capacity(count.min(1024));
    for _ in 0..count {
        ops.push(r.op()?);
    }
    Ok((stream_id, ops))
}

struct Reader {
    buf: Bytes,
    pos: usize,
}

impl Reader {
    fn take(&mut self, n: usize) -> Result<Bytes, FormatError> {
        if self.buf.len() - self.pos < n {
            return Err(FormatError("truncated op"));
        }
        let out = self.buf.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(self.take(4)?.get_u32_le())
    }
    fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(self.take(8)?.get_u64_le())
    }
    fn string(&mut self) -> Result<String, FormatError> {
        let len = self.u32()? as usize;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| FormatError("string is not UTF-8"))
    }
    fn bytes(&mut self) -> Result<Bytes, FormatError> {
        let len = self.u32()? as usize;
        self.take(len)
    }
    fn opt_u64(&mut self) -> Result<Option<u64>, FormatError> {
        Ok(if self.u8()? == 1 {
            Some(self.u64()?)
        } else {
            None
        })
    }
    fn op(&mut self) -> Result<Op, FormatError> {
        match self.u8()? {
            TAG_CREATE => {
                let name = self.string()?;
                let content_type = self.string()?;
                let created_ms = self.u64()?;
                let ttl_secs = self.opt_u64()?;
                let expires_at = Some(self.string()?).filter(|s| !s.is_empty());
                let marker = self.u8()?;
                let fork = if marker == 1 || marker == FORK_WITH_SEQ {
                    Some(ForkOrigin {
                        source_id: self.u64()?,
                        point: Offset(self.u64()?),
                        requested_offset: self.opt_u64()?.map(Offset),
                        sub_offset: self.u64()?,
                        point_seq: if marker == FORK_WITH_SEQ {
                            self.u64()?
                        } else {
                            0
                        },
                    })
                } else {
                    None
                };
                Ok(Op::Create(CreateOp {
                    name,
                    content_type,
                    created_ms,
                    ttl_secs,
                    expires_at,
                    fork,
                }))
            }
            TAG_APPEND => {
                let start = Offset(self.u64()?);
                let flags = self.u8()?;
                let producer = if flags & 2 != 0 {
                    Some(ProducerStamp {
                        id: self.string()?,
                        epoch: self.u64()?,
                        seq: self.u64()?,
                    })
                } else {
                    None
                };
                let stream_seq = if flags & 4 != 0 {
                    Some(self.string()?)
                } else {
                    None
                };
                let start_seq = if flags & APPEND_HAS_SEQ != 0 {
                    self.u64()?
                } else {
                    0
                };
                let count = self.u32()? as usize;
                let mut records = Vec::with_capacity(count.min(4096));
                for _ in 0..count {
                    let ts_ms = self.u64()?;
                    let rflags = self.u8()?;
                    let len = self.u32()? as usize;
                    let data = self.take(len)?;
                    let ext = if rflags & RECORD_EXT != 0 {
                        Some(self.bytes()?)
                    } else {
                        None
                    };
                    records.push(Record {
                        ts_ms,
                        flags: rflags,
                        data,
                        ext,
                    });
                }
                Ok(Op::Append(AppendOp {
                    start,
                    start_seq,
                    records: Arc::new(records),
                    close: flags & 1 != 0,
                    producer,
                    stream_seq,
                }))
            }
            TAG_DELETE => Ok(Op::Delete {
                soft: self.u8()? == 1,
            }),
            tag @ (TAG_RELOCATE | TAG_RELOCATE_SEQ) => Ok(Op::Relocate(RelocateOp {
                stream_id: self.u64()?,
                start: Offset(self.u64()?),
                end: Offset(self.u64()?),
                object_key: self.string()?,
                byte_range: self.u64()?..self.u64()?,
                last_ts_ms: self.u64()?,
                start_seq: if tag == TAG_RELOCATE_SEQ {
                    self.u64()?
                } else {
                    0
                },
            })),
            TAG_TRIM => Ok(Op::Trim {
                before: Offset(self.u64()?),
            }),
            TAG_SET_RETENTION => Ok(Op::SetRetention {
                secs: self.opt_u64()?,
            }),
            TAG_PUT_TOKEN => Ok(Op::PutToken(TokenRecord {
                id: self.string()?,
                secret_hash: self.bytes()?.to_vec(),
                parent_id: Some(self.string()?).filter(|p| !p.is_empty()),
                description: self.string()?,
                scopes: self.string()?,
                namespace: self.string()?,
                created_ms: self.u64()?,
                expires_ms: self.opt_u64()?,
                revoked_ms: self.opt_u64()?,
            })),
            TAG_REVOKE_TOKENS => {
                let at_ms = self.u64()?;
                let count = self.u32()? as usize;
                let mut ids = Vec::with_capacity(count.min(1024));
                for _ in 0..count {
                    ids.push(self.string()?);
                }
                Ok(Op::RevokeTokens { ids, at_ms })
            }
            TAG_PUT_SERVER_KEY => Ok(Op::PutServerKey {
                name: self.string()?,
                key: self.bytes()?,
            }),
            TAG_REGISTRY_PUT => Ok(Op::RegistryPut {
                table: self.string()?,
                key: self.string()?,
                value: self.string()?,
                replace: match self.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(FormatError("bad registry flag")),
                },
            }),
            TAG_REGISTRY_DELETE => Ok(Op::RegistryDelete {
                table: self.string()?,
                key: self.string()?,
            }),
            _ => Err(FormatError("unknown op tag")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_round_trips() {
        let ops = vec![
            Op::Create(CreateOp {
                name: "a/b".into(),
                content_type: "application/json".into(),
                created_ms: 7,
                ttl_secs: Some(60),
                expires_at: None,
                fork: Some(ForkOrigin {
                    source_id: 3,
                    point: Offset(5),
                    requested_offset: None,
                    sub_offset: 2,
                    point_seq: 4,
                }),
            }),
            Op::Append(AppendOp {
                start: Offset(0),
                start_seq: 11,
                records: std::sync::Arc::new(vec![
                    Record::plain(9, RECORD_BATCH_START, Bytes::from_static(b"hello")),
                    Record {
                        ts_ms: 9,
                        flags: RECORD_EXT,
                        data: Bytes::from_static(b"x"),
                        ext: Some(
                            RecordExt {
                                client_ts_ms: Some(3),
                                headers: vec![("k".into(), Bytes::from_static(b"v"))],
                                ..RecordExt::default()
                            }
                            .encode(),
                        ),
                    },
                ]),
                close: true,
                producer: Some(ProducerStamp {
                    id: "p".into(),
                    epoch: 1,
                    seq: 2,
                }),
                stream_seq: Some("s1".into()),
            }),
            Op::Trim { before: Offset(3) },
            Op::SetRetention { secs: Some(3600) },
            Op::SetRetention { secs: None },
            Op::Delete { soft: true },
            Op::PutToken(TokenRecord {
                id: "tok_1".into(),
                secret_hash: vec![7; 32],
                parent_id: Some("bootstrap".into()),
                description: "d".into(),
                scopes: "read:**".into(),
                namespace: "t/".into(),
                created_ms: 5,
                expires_ms: Some(9),
                revoked_ms: None,
            }),
            Op::PutToken(TokenRecord {
                id: "bootstrap".into(),
                secret_hash: vec![1; 32],
                parent_id: None,
                description: String::new(),
                scopes: "all:**".into(),
                namespace: String::new(),
                created_ms: 1,
                expires_ms: None,
                revoked_ms: Some(2),
            }),
            Op::RevokeTokens {
                ids: vec!["a".into(), "b".into()],
                at_ms: 77,
            },
            Op::PutServerKey {
                name: "read-token-hmac".into(),
                key: Bytes::from_static(&[3; 32]),
            },
            Op::RegistryPut {
                table: "schema".into(),
                key: "1".into(),
                value: "{}".into(),
                replace: false,
            },
            Op::RegistryDelete {
                table: "binding".into(),
                key: "a/b".into(),
            },
            Op::Relocate(RelocateOp {
                stream_id: 9,
                start: Offset(10),
                end: Offset(20),
                object_key: "seg/x".into(),
                byte_range: 30..40,
                last_ts_ms: 50,
                start_seq: 7,
            }),
        ];
        let mut out = BytesMut::new();
        encode_header(&mut out, 4, 5, 1);
        let range = encode_chunk(&mut out, 42, ops.iter());
        let object = out.freeze();
        let (header, chunks) = decode_object(&object).unwrap();
        assert_eq!((header.epoch, header.seq), (4, 5));
        assert_eq!(chunks[0].stream_id, 42);
        assert_eq!(chunks[0].ops, ops);
        assert_eq!(chunks[0].range, range.clone());
        // A ranged read of just the chunk decodes on its own.
        let (id, again) = decode_chunk(&object.slice(range)).unwrap();
        assert_eq!((id, again), (42, ops));
    }

    #[test]
    fn record_extensions_round_trip() {
        for ext in [
            RecordExt::default(),
            RecordExt {
                client_ts_ms: Some(0),
                headers: vec![
                    ("a".into(), Bytes::from_static(b"1")),
                    ("a".into(), Bytes::new()),
                    ("trace".into(), Bytes::from_static(&[0, 255])),
                ],
                ..RecordExt::default()
            },
            RecordExt {
                key: Some(Bytes::from_static(b"user-7")),
                ..RecordExt::default()
            },
            RecordExt {
                key: Some(Bytes::new()),
                null_value: true,
                headers: vec![("h".into(), Bytes::from_static(b"v"))],
                client_ts_ms: None,
                empty_value: false,
            },
            RecordExt {
                empty_value: true,
                ..RecordExt::default()
            },
            RecordExt {
                null_value: true,
                ..RecordExt::default()
            },
        ] {
            assert_eq!(RecordExt::decode(&ext.encode()).unwrap(), ext);
        }
        // Written before keys existed: no tail, no key.
        let old = RecordExt {
            client_ts_ms: Some(5),
            ..RecordExt::default()
        }
        .encode();
        assert_eq!(old.len(), 12);
        assert_eq!(RecordExt::decode(&old).unwrap().key, None);
        assert!(RecordExt::decode(&Bytes::from_static(&[1, 2, 3])).is_err());
        let mut unknown_flag = old.to_vec();
        unknown_flag.push(8);
        assert!(RecordExt::decode(&Bytes::from(unknown_flag)).is_err());
    }

    /// `encoded_len` is what buffer accounting charges: it must cover the real bytes.
    #[test]
    fn encoded_len_covers_small_ops() {
        for op in [
            Op::Trim {
                before: Offset(u64::MAX),
            },
            Op::SetRetention { secs: Some(1) },
            Op::SetRetention { secs: None },
            Op::Delete { soft: false },
        ] {
            let mut out = BytesMut::new();
            encode_op(&mut out, &op);
            assert_eq!(out.len(), encoded_len(&op), "{op:?}");
        }
    }

    /// The tags are the on-disk format: they never change meaning.
    #[test]
    fn op_tags_are_stable() {
        let tag = |op: Op| {
            let mut out = BytesMut::new();
            encode_op(&mut out, &op);
            out[0]
        };
        assert_eq!(tag(Op::Delete { soft: true }), 3);
        assert_eq!(tag(Op::Trim { before: Offset(1) }), 4);
        assert_eq!(tag(Op::SetRetention { secs: None }), 5);
    }

    #[test]
    fn detects_corruption() {
        let mut out = BytesMut::new();
        encode_header(&mut out, 1, 1, 1);
        encode_chunk(&mut out, 1, [Op::Delete { soft: false }].iter());
        let last = out.len() - 1;
        out[last] ^= 0xff;
        assert!(decode_object(&out.freeze()).is_err());
    }

    #[test]
    fn keys_sort_in_write_order() {}
}
