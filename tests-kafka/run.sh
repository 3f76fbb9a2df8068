#!/usr/bin/env bash
# Real Kafka clients against real `picomq serve --kafka-listen` servers
# (tests-kafka/clients.py): librdkafka through confluent-kafka, kafka-python, kcat
# and kafkajs, installed here from PyPI, Debian's packages and npm.
# Usage: run.sh PICOMQ_BINARY
set -euo pipefail
BIN=$1
HERE=$(cd "$(dirname "$0")" && pwd)

if ! command -v kcat >/dev/null; then
  apt-get install -y -q kcat >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q kcat >/dev/null; }
fi
# Pinned: the versions these tests were written against. python-snappy, lz4 and
# zstandard give kafka-python its codecs.
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
  "confluent-kafka[avro,json,protobuf,schemaregistry]==2.16.1" fastavro==1.13.1 \
  jsonschema==4.26.0 protobuf==7.36.2 \
  kafka-python==3.0.12 python-snappy==0.7.3 lz4==4.4.5 zstandard==0.25.0
# kafkajs from the npm registry, pinned by package-lock.json.
(cd "$HERE/kafkajs" && npm ci --no-audit --no-fund --loglevel=error >&2)
python3 -u "$HERE/clients.py" "$BIN"
