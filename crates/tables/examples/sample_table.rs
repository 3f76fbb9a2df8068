//! Writes a small partitioned table under a directory (`file://` URIs) in two
//! commits, for readers to check: `cargo run -p picomq-tables --example
//! sample_table -- DIR` prints the path of the last metadata file.

use std::collections::BTreeMap;

use picomq_tables::commit::{commit, create, Append};
use picomq_tables::manifest::DataFile;
use picomq_tables::metadata::{PartitionField, PartitionSpec, Schema, TableMetadata};
use picomq_tables::parquet::{write, Column, Datum, Field, Kind};
use picomq_tables::partition::{of_timestamp, parse};

fn field(id: i32, name: &str, kind: Kind, required: bool) -> Field {
    Field {
        id,
        name: name.into(),
        kind,
        required,
    }
}

fn main() {
    let dir = std::env::args().nth(1).expect("a directory");
    let dir = std::fs::canonicalize(&dir).expect("the directory exists");
    let location = format!("file://{}/t", dir.display());
    let fields = vec![
        field(1, "stream", Kind::String, true),
        field(2, "seq", Kind::Long, true),
        field(3, "timestamp", Kind::TimestampTz, true),
        field(4, "headers", Kind::String, false),
        field(5, "key", Kind::Binary, false),
        field(6, "value", Kind::String, false),
        field(7, "score", Kind::Double, false),
        field(8, "ok", Kind::Boolean, false),
        field(9, "n", Kind::Int, false),
    ];
    let part = parse("day(timestamp)", &fields, 1000).unwrap();
    let spec = PartitionSpec {
        spec_id: 0,
        fields: vec![PartitionField {
            source_id: part.source_id,
            field_id: part.field_id,
            name: part.name.clone(),
            transform: part.transform.name().into(),
        }],
    };
    let mut meta = TableMetadata::new(&location, Schema::new(0, &fields), spec, 1_796_553_000_000);
    let (mut meta_path, bytes) = create(&meta);
    put(&meta_path, &bytes);
    let mut live = Vec::new();
    let day = 86_400_000_000i64;
    let t0 = 1_796_553_000_000_000i64;
    let mut seq = 0i64;
    for round in 0..2 {
        let mut files = Vec::new();
        for d in 0..2 {
            let mut cols: Vec<Column> = fields.iter().map(|f| Column::new(f.kind)).collect();
            let ts = t0 + (round * 2 + d) * day;
            for i in 0..1000 {
                let v = format!("{{\"i\":{i}}}");
                cols[0].push(Datum::Bytes(b"orders/eu")).unwrap();
                cols[1].push(Datum::Long(seq)).unwrap();
                cols[2].push(Datum::Long(ts + i)).unwrap();
                cols[3]
                    .push(if i % 2 == 0 {
                        Datum::Null
                    } else {
                        Datum::Bytes(b"{\"h\":\"1\"}")
                    })
                    .unwrap();
                cols[4]
                    .push(if i % 3 == 0 {
                        Datum::Null
                    } else {
                        Datum::Bytes(&[0, 1, 2])
                    })
                    .unwrap();
                cols[5].push(Datum::Bytes(v.as_bytes())).unwrap();
                cols[6].push(Datum::Double(i as f64 / 2.0)).unwrap();
                cols[7]
                    .push(if i % 5 == 0 {
                        Datum::Null
                    } else {
                        Datum::Bool(i % 2 == 0)
                    })
                    .unwrap();
                cols[8].push(Datum::Int(i as i32)).unwrap();
                seq += 1;
            }
            let (bytes, columns) = write(&fields, &cols).unwrap();
            let path = format!("{location}/data/{}.parquet", uuid_like(round, d));
            put(&path, &bytes);
            files.push(DataFile {
                path,
                partition: vec![Some(of_timestamp(part.transform, ts))],
                records: 1000,
                size: bytes.len() as u64,
                columns,
            });
        }
        let c = commit(
            &meta,
            &meta_path,
            &live,
            std::slice::from_ref(&part),
            Append {
                files,
                offsets: BTreeMap::from([("orders/eu".to_string(), seq as u64)]),
                replaces: vec![],
                ranges: BTreeMap::new(),
                keep_snapshots: 100,
            },
            1_796_553_000_000 + round * 1000,
        )
        .unwrap();
        for (p, b) in &c.objects {
            put(p, b);
        }
        meta = c.metadata;
        meta_path = c.metadata_path;
        live = c.manifests;
    }
    println!("{meta_path}");
}

fn uuid_like(round: i64, d: i64) -> String {
    format!("r{round}-d{d}")
}

fn put(uri: &str, bytes: &[u8]) {
    let path = uri.strip_prefix("file://").expect("a file URI");
    std::fs::create_dir_all(std::path::Path::new(path).parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}
