//! A Parquet writer for flat tables: one row group, columns of Iceberg's primitive
//! types, PLAIN values, definition levels for optional columns, snappy pages of
//! about 1 MiB, and Parquet field ids (Iceberg reads columns by id). It also
//! returns what an Iceberg manifest records of each column.
//!
//! Nested values (JSON objects, arrays) are written as JSON strings by the caller:
//! no repetition levels here. docs/tables.md says why.

use crate::thrift::{ty, Writer};
use crate::Error;

/// An Iceberg primitive type and how it is stored in Parquet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Boolean,
    /// 32-bit signed integer.
    Int,
    /// 64-bit signed integer.
    Long,
    Double,
    /// UTF-8 text.
    String,
    Binary,
    /// Microseconds since the epoch, UTC.
    TimestampTz,
    /// Days since 1970-01-01.
    Date,
}

impl Kind {
    /// The type's name in Iceberg table metadata.
    pub fn iceberg(self) -> &'static str {
        match self {
            Kind::Boolean => "boolean",
            Kind::Int => "int",
            Kind::Long => "long",
            Kind::Double => "double",
            Kind::String => "string",
            Kind::Binary => "binary",
            Kind::TimestampTz => "timestamptz",
            Kind::Date => "date",
        }
    }

    /// The inverse of [`Kind::iceberg`].
    pub fn from_iceberg(name: &str) -> Option<Kind> {
        Some(match name {
            "boolean" => Kind::Boolean,
            "int" => Kind::Int,
            "long" => Kind::Long,
            "double" => Kind::Double,
            "string" => Kind::String,
            "binary" => Kind::Binary,
            "timestamptz" => Kind::TimestampTz,
            "date" => Kind::Date,
            _ => return None,
        })
    }

    /// Parquet's physical type number.
    fn physical(self) -> i32 {
        match self {
            Kind::Boolean => 0,
            Kind::Int | Kind::Date => 1,
            Kind::Long | Kind::TimestampTz => 2,
            Kind::Double => 5,
            Kind::String | Kind::Binary => 6,
        }
    }
}

/// One column of a table: its Iceberg field id, name and type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub id: i32,
    pub name: String,
    pub kind: Kind,
    pub required: bool,
}

/// The values of one column, nulls kept apart from the dense non-null values.
#[derive(Clone, Debug)]
pub struct Column {
    kind: Kind,
    valid: Vec<bool>,
    values: Values,
}

#[derive(Clone, Debug)]
enum Values {
    Bool(Vec<bool>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    F64(Vec<f64>),
    Bytes { data: Vec<u8>, ends: Vec<usize> },
}

/// A value to append to a [`Column`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Datum<'a> {
    Null,
    Bool(bool),
    Int(i32),
    Long(i64),
    Double(f64),
    Bytes(&'a [u8]),
}

impl Column {
    pub fn new(kind: Kind) -> Column {
        let values = match kind {
            Kind::Boolean => Values::Bool(Vec::new()),
            Kind::Int | Kind::Date => Values::I32(Vec::new()),
            Kind::Long | Kind::TimestampTz => Values::I64(Vec::new()),
            Kind::Double => Values::F64(Vec::new()),
            Kind::String | Kind::Binary => Values::Bytes {
                data: Vec::new(),
                ends: Vec::new(),
            },
        };
        Column {
            kind,
            valid: Vec::new(),
            values,
        }
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Rows so far, nulls included.
    pub fn len(&self) -> usize {
        self.valid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.valid.is_empty()
    }

    /// Bytes held, roughly: what a file being built costs in memory.
    pub fn bytes(&self) -> usize {
        self.valid.len()
            + match &self.values {
                Values::Bool(v) => v.len(),
                Values::I32(v) => v.len() * 4,
                Values::I64(v) => v.len() * 8,
                Values::F64(v) => v.len() * 8,
                Values::Bytes { data, ends } => data.len() + ends.len() * 8,
            }
    }

    /// Appends a value; a datum of the wrong type for the column is an error (and
    /// nothing is appended).
    pub fn push(&mut self, d: Datum<'_>) -> Result<(), Error> {
        match (&mut self.values, d) {
            (_, Datum::Null) => {
                self.valid.push(false);
                return Ok(());
            }
            (Values::Bool(v), Datum::Bool(b)) => v.push(b),
            (Values::I32(v), Datum::Int(i)) => v.push(i),
            (Values::I64(v), Datum::Long(i)) => v.push(i),
            (Values::F64(v), Datum::Double(f)) => v.push(f),
            (Values::Bytes { data, ends }, Datum::Bytes(b)) => {
                data.extend_from_slice(b);
                ends.push(data.len());
            }
            (_, d) => {
                return Err(Error::Invalid(format!(
                    "a {d:?} does not go in a {} column",
                    self.kind.iceberg()
                )))
            }
        }
        self.valid.push(true);
        Ok(())
    }

    fn null_count(&self) -> usize {
        self.valid.iter().filter(|v| !**v).count()
    }
}

/// What an Iceberg manifest records of one column of a data file.
#[derive(Clone, Debug, PartialEq)]
pub struct ColumnMetrics {
    pub field_id: i32,
    /// Bytes of the column chunk in the file (compressed, page headers included).
    pub size: u64,
    pub values: u64,
    pub nulls: u64,
    /// Iceberg's single-value serialization of the least and greatest value, where
    /// known exactly (not for long strings or NaN-bearing doubles).
    pub lower: Option<Vec<u8>>,
    pub upper: Option<Vec<u8>>,
}

/// Strings and binaries longer than this get no bounds (a truncated bound would
/// need care to stay a bound; the columns worth pruning on are short).
const MAX_BOUND_BYTES: usize = 64;
/// Uncompressed bytes after which a page is cut.
const PAGE_BYTES: usize = 1 << 20;

/// Writes a Parquet file of `fields` with the values in `columns` (in the same
/// order, all of one length). Returns the file and each column's metrics.
pub fn write(fields: &[Field], columns: &[Column]) -> Result<(Vec<u8>, Vec<ColumnMetrics>), Error> {
    if fields.len() != columns.len() || fields.is_empty() {
        return Err(Error::Invalid(format!(
            "{} fields but {} columns",
            fields.len(),
            columns.len()
        )));
    }
    let rows = columns[0].len();
    for (f, c) in fields.iter().zip(columns) {
        if c.kind != f.kind {
            return Err(Error::Invalid(format!(
                "column {} is {} but holds {} values",
                f.name,
                f.kind.iceberg(),
                c.kind.iceberg()
            )));
        }
        if c.len() != rows {
            return Err(Error::Invalid(format!(
                "column {} has {} rows, not {rows}",
                f.name,
                c.len()
            )));
        }
        if f.required && c.null_count() > 0 {
            return Err(Error::Invalid(format!(
                "required column {} holds a null",
                f.name
            )));
        }
    }
    let mut file = b"PAR1".to_vec();
    let mut chunks = Vec::with_capacity(fields.len());
    let mut metrics = Vec::with_capacity(fields.len());
    for (f, c) in fields.iter().zip(columns) {
        let start = file.len();
        let uncompressed = write_chunk(&mut file, f, c)?;
        let size = (file.len() - start) as u64;
        let (lower, upper) = bounds(c);
        chunks.push(Chunk {
            start: start as i64,
            compressed: size as i64,
            uncompressed: uncompressed as i64,
            stats: parquet_stats(c),
        });
        metrics.push(ColumnMetrics {
            field_id: f.id,
            size,
            values: rows as u64,
            nulls: c.null_count() as u64,
            lower,
            upper,
        });
    }
    let footer = footer(fields, columns, &chunks, rows);
    file.extend_from_slice(&footer);
    file.extend_from_slice(&(footer.len() as u32).to_le_bytes());
    file.extend_from_slice(b"PAR1");
    Ok((file, metrics))
}

struct Chunk {
    start: i64,
    compressed: i64,
    uncompressed: i64,
    stats: Option<(Vec<u8>, Vec<u8>)>,
}

/// Writes a column's pages; returns their uncompressed size, headers included.
fn write_chunk(file: &mut Vec<u8>, f: &Field, c: &Column) -> Result<usize, Error> {
    let mut uncompressed = 0;
    let mut row = 0;
    let mut value = 0;
    let mut encoder = snap::raw::Encoder::new();
    loop {
        // One page: rows until about PAGE_BYTES of values.
        let (row_end, value_end) = page_end(c, row, value);
        let mut body = Vec::new();
        if !f.required {
            levels(&mut body, &c.valid[row..row_end]);
        }
        plain(&mut body, c, value, value_end);
        let packed = encoder
            .compress_vec(&body)
            .map_err(|e| Error::Invalid(format!("snappy: {e}")))?;
        let mut h = Writer::new();
        h.i32(1, 0); // DATA_PAGE
        h.i32(2, body.len() as i32);
        h.i32(3, packed.len() as i32);
        h.begin(5);
        h.i32(1, (row_end - row) as i32);
        h.i32(2, 0); // PLAIN
        h.i32(3, 3); // RLE
        h.i32(4, 3); // RLE
        h.end();
        let header = h.finish();
        uncompressed += header.len() + body.len();
        file.extend_from_slice(&header);
        file.extend_from_slice(&packed);
        row = row_end;
        value = value_end;
        if row >= c.len() {
            return Ok(uncompressed);
        }
    }
}

/// Where the page starting at `row` (whose first non-null value is `value`) ends.
fn page_end(c: &Column, mut row: usize, mut value: usize) -> (usize, usize) {
    let mut bytes = 0;
    while row < c.len() && bytes < PAGE_BYTES {
        if c.valid[row] {
            bytes += match &c.values {
                Values::Bool(_) => 1,
                Values::I32(_) => 4,
                Values::I64(_) | Values::F64(_) => 8,
                Values::Bytes { ends, .. } => {
                    let start = if value == 0 { 0 } else { ends[value - 1] };
                    4 + ends[value] - start
                }
            };
            value += 1;
        } else {
            bytes += 1;
        }
        row += 1;
    }
    (row, value)
}

/// Definition levels of a flat optional column: one bit-packed run of bit width
/// 1 (the validity bitmap), after its 4-byte length.
fn levels(out: &mut Vec<u8>, valid: &[bool]) {
    let groups = valid.len().div_ceil(8);
    let mut run = Vec::with_capacity(groups + 5);
    let mut header = ((groups as u64) << 1) | 1;
    while header >= 0x80 {
        run.push((header as u8) | 0x80);
        header >>= 7;
    }
    run.push(header as u8);
    let mut bits = vec![0u8; groups];
    for (i, v) in valid.iter().enumerate() {
        if *v {
            bits[i / 8] |= 1 << (i % 8);
        }
    }
    run.extend_from_slice(&bits);
    out.extend_from_slice(&(run.len() as u32).to_le_bytes());
    out.extend_from_slice(&run);
}

/// PLAIN encoding of the non-null values `from..to`.
fn plain(out: &mut Vec<u8>, c: &Column, from: usize, to: usize) {
    match &c.values {
        Values::Bool(v) => {
            let mut bits = vec![0u8; (to - from).div_ceil(8)];
            for (i, b) in v[from..to].iter().enumerate() {
                if *b {
                    bits[i / 8] |= 1 << (i % 8);
                }
            }
            out.extend_from_slice(&bits);
        }
        Values::I32(v) => v[from..to]
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Values::I64(v) => v[from..to]
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Values::F64(v) => v[from..to]
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Values::Bytes { data, ends } => {
            for i in from..to {
                let start = if i == 0 { 0 } else { ends[i - 1] };
                out.extend_from_slice(&((ends[i] - start) as u32).to_le_bytes());
                out.extend_from_slice(&data[start..ends[i]]);
            }
        }
    }
}

fn byte_values<'a>(data: &'a [u8], ends: &'a [usize]) -> impl Iterator<Item = &'a [u8]> {
    ends.iter().scan(0, move |start, &end| {
        let v = &data[*start..end];
        *start = end;
        Some(v)
    })
}

/// Least and greatest values in Iceberg's single-value serialization.
fn bounds(c: &Column) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    match &c.values {
        Values::Bool(v) => {
            let lo = v.iter().copied().min().map(|b| vec![b as u8]);
            let hi = v.iter().copied().max().map(|b| vec![b as u8]);
            (lo, hi)
        }
        Values::I32(v) => (
            v.iter().min().map(|x| x.to_le_bytes().to_vec()),
            v.iter().max().map(|x| x.to_le_bytes().to_vec()),
        ),
        Values::I64(v) => (
            v.iter().min().map(|x| x.to_le_bytes().to_vec()),
            v.iter().max().map(|x| x.to_le_bytes().to_vec()),
        ),
        Values::F64(v) => {
            if v.iter().any(|x| x.is_nan()) {
                return (None, None);
            }
            let lo = v.iter().copied().reduce(f64::min);
            let hi = v.iter().copied().reduce(f64::max);
            (
                lo.map(|x| x.to_le_bytes().to_vec()),
                hi.map(|x| x.to_le_bytes().to_vec()),
            )
        }
        Values::Bytes { data, ends } => {
            let lo = byte_values(data, ends).min();
            let hi = byte_values(data, ends).max();
            let keep =
                |b: Option<&[u8]>| b.filter(|b| b.len() <= MAX_BOUND_BYTES).map(<[u8]>::to_vec);
            (keep(lo), keep(hi))
        }
    }
}

/// Min and max for the Parquet chunk statistics (PLAIN, without length prefixes):
/// numbers only, where readers prune with them.
fn parquet_stats(c: &Column) -> Option<(Vec<u8>, Vec<u8>)> {
    match &c.values {
        Values::I32(_) | Values::I64(_) | Values::F64(_) => {
            let (lo, hi) = bounds(c);
            Some((lo?, hi?))
        }
        _ => None,
    }
}

fn footer(fields: &[Field], columns: &[Column], chunks: &[Chunk], rows: usize) -> Vec<u8> {
    let mut w = Writer::new();
    w.i32(1, 1);
    // The schema: the root, then one leaf per column.
    w.list(2, ty::STRUCT, fields.len() + 1);
    w.elem_struct();
    w.binary(4, b"table");
    w.i32(5, fields.len() as i32);
    w.end();
    for f in fields {
        w.elem_struct();
        w.i32(1, f.kind.physical());
        w.i32(3, if f.required { 0 } else { 1 });
        w.binary(4, f.name.as_bytes());
        match f.kind {
            Kind::String => w.i32(6, 0),       // UTF8
            Kind::Date => w.i32(6, 6),         // DATE
            Kind::TimestampTz => w.i32(6, 10), // TIMESTAMP_MICROS
            _ => {}
        }
        w.i32(9, f.id);
        match f.kind {
            Kind::String => {
                w.begin(10);
                w.begin(1);
                w.end();
                w.end();
            }
            Kind::Date => {
                w.begin(10);
                w.begin(6);
                w.end();
                w.end();
            }
            Kind::TimestampTz => {
                w.begin(10);
                w.begin(8);
                w.bool(1, true);
                w.begin(2);
                w.begin(2); // MICROS
                w.end();
                w.end();
                w.end();
                w.end();
            }
            _ => {}
        }
        w.end();
    }
    w.i64(3, rows as i64);
    // One row group.
    w.list(4, ty::STRUCT, 1);
    w.elem_struct();
    w.list(1, ty::STRUCT, chunks.len());
    for ((f, c), chunk) in fields.iter().zip(columns).zip(chunks) {
        w.elem_struct();
        w.i64(2, chunk.start);
        w.begin(3);
        w.i32(1, f.kind.physical());
        w.list(2, ty::I32, 2);
        w.elem_i32(0); // PLAIN
        w.elem_i32(3); // RLE
        w.list(3, ty::BINARY, 1);
        w.elem_binary(f.name.as_bytes());
        w.i32(4, 1); // SNAPPY
        w.i64(5, rows as i64);
        w.i64(6, chunk.uncompressed);
        w.i64(7, chunk.compressed);
        w.i64(9, chunk.start);
        w.begin(12);
        w.i64(3, c.null_count() as i64);
        if let Some((lo, hi)) = &chunk.stats {
            w.binary(5, hi);
            w.binary(6, lo);
        }
        w.end();
        w.end();
        w.end();
    }
    w.i64(2, chunks.iter().map(|c| c.uncompressed).sum());
    w.i64(3, rows as i64);
    w.i64(5, chunks.first().map_or(4, |c| c.start));
    w.i64(6, chunks.iter().map(|c| c.compressed).sum());
    w.end();
    w.binary(
        6,
        concat!("picomq version ", env!("CARGO_PKG_VERSION")).as_bytes(),
    );
    // Statistics' order: the type's own, for every column.
    w.list(7, ty::STRUCT, fields.len());
    for _ in fields {
        w.elem_struct();
        w.begin(1);
        w.end();
        w.end();
    }
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(id: i32, name: &str, kind: Kind, required: bool) -> Field {
        Field {
            id,
            name: name.into(),
            kind,
            required,
        }
    }

    #[test]
    fn a_file_is_framed_and_its_metrics_are_exact() {
        let fields = [
            field(1, "seq", Kind::Long, true),
            field(2, "body", Kind::String, false),
        ];
        let mut seq = Column::new(Kind::Long);
        let mut body = Column::new(Kind::String);
        for i in 0..10 {
            seq.push(Datum::Long(100 - i)).unwrap();
            if i % 3 == 0 {
                body.push(Datum::Null).unwrap();
            } else {
                body.push(Datum::Bytes(format!("v{i}").as_bytes())).unwrap();
            }
        }
        let (file, metrics) = write(&fields, &[seq, body]).unwrap();
        assert_eq!(&file[..4], b"PAR1");
        assert_eq!(&file[file.len() - 4..], b"PAR1");
        let footer = u32::from_le_bytes(file[file.len() - 8..file.len() - 4].try_into().unwrap());
        assert!((footer as usize) < file.len());
        assert_eq!(metrics[0].lower, Some(91i64.to_le_bytes().to_vec()));
        assert_eq!(metrics[0].upper, Some(100i64.to_le_bytes().to_vec()));
        assert_eq!(metrics[1].nulls, 4);
        assert_eq!(metrics[1].lower.as_deref(), Some(&b"v1"[..]));
        assert_eq!(metrics[1].upper.as_deref(), Some(&b"v8"[..]));
        let sizes: u64 = metrics.iter().map(|m| m.size).sum();
        assert_eq!(sizes as usize + 4 + footer as usize + 8, file.len());
    }

    #[test]
    fn refuses_what_it_cannot_write() {
        let fields = [field(1, "a", Kind::Long, true)];
        let mut c = Column::new(Kind::Long);
        assert!(c.push(Datum::Bytes(b"x")).is_err());
        c.push(Datum::Null).unwrap();
        assert!(write(&fields, &[c]).is_err());
        assert!(write(&fields, &[Column::new(Kind::String)]).is_err());
        assert!(write(&[], &[]).is_err());
    }

    #[test]
    fn big_columns_are_cut_into_pages() {
        let fields = [field(1, "b", Kind::Binary, false)];
        let mut c = Column::new(Kind::Binary);
        let v = vec![7u8; 100_000];
        for i in 0..30 {
            c.push(if i == 5 {
                Datum::Null
            } else {
                Datum::Bytes(&v)
            })
            .unwrap();
        }
        let (file, metrics) = write(&fields, &[c]).unwrap();
        assert_eq!(metrics[0].values, 30);
        assert_eq!(metrics[0].nulls, 1);
        assert!(metrics[0].lower.is_none(), "long binaries get no bounds");
        assert!(file.len() < 3_000_000);
    }

    #[test]
    fn levels_are_a_bitmap_run() {
        let mut out = Vec::new();
        levels(&mut out, &[true, false, true]);
        assert_eq!(out, vec![2, 0, 0, 0, 3, 5]);
    }
}
