#!/usr/bin/env bash
# Streams as Iceberg tables, read by real engines (tests-tables/tables.py):
# pyiceberg through PicoMQ's REST catalog, and DuckDB over the same Parquet files,
# both installed here from PyPI. Usage: run.sh PICOMQ_BINARY
set -euo pipefail
BIN=$1
HERE=$(cd "$(dirname "$0")" && pwd)
# Pinned: the versions these tests were written against (confluent-kafka's as
# in tests-kafka: its serializers and registry client write the typed records).
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
  "pyiceberg[pyarrow]==0.12.0" pyarrow==26.0.1 duckdb==2.0.1 \
  "confluent-kafka[avro,json,protobuf,schemaregistry]==2.16.1" fastavro==1.13.1
python3 -u "$HERE/tables.py" "$BIN"
