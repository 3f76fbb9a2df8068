"""Streams as Iceberg tables: what an export costs and how soon appends are
queryable. Talks HTTP to a running `picomq serve` (tables.sh starts one).

1. Backlog export: STREAMS JSON streams get RECORDS records of about
   RECORD_BYTES each (batches of 1,000 per request), then a table over them
   (commitInterval 1s) is defined; the time until its lag is 0 gives records/s
   and MiB/s of source records, and the exporter's own counters give the
   object-store requests (PUTs, GETs) per MiB exported and the files written.
2. Append-to-visibility: with a table at the default commitInterval (1m) and at
   1s, a record is appended at a random moment and the REST catalog's table
   (what pyiceberg, DuckDB or Spark load) is polled until its snapshot counts it.

Usage: tables.py URL   (env: STREAMS=8 RECORDS=1000000 RECORD_BYTES=200
                         VIS_DEFAULT=3 VIS_FAST=10)
"""

import json
import os
import random
import statistics
import sys
import time
import urllib.request

URL = sys.argv[1]
STREAMS = int(os.environ.get("STREAMS", 8))
RECORDS = int(os.environ.get("RECORDS", 1_000_000))
RECORD_BYTES = int(os.environ.get("RECORD_BYTES", 200))
VIS_DEFAULT = int(os.environ.get("VIS_DEFAULT", 3))
VIS_FAST = int(os.environ.get("VIS_FAST", 10))


def http(method, path, body=None, ctype="application/json"):
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method=method)
    if data is not None:
        req.add_header("content-type", ctype)
    with urllib.request.urlopen(req, timeout=120) as r:
        out = r.read()
        return json.loads(out) if out else None


def metrics(table):
    text = urllib.request.urlopen(URL + "/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("picomq_table_") and f'table="{table}"' in line:
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0] + ("/" + name.split('kind="')[1][:3] if "kind=" in name else "")] = float(value)
    return out


def table_records(ns, t):
    """Records in the table's current snapshot, as the REST catalog serves it."""
    m = http("GET", f"/__picomq/iceberg/v1/namespaces/{ns}/tables/{t}")["metadata"]
    cur = m.get("current-snapshot-id")
    for s in m.get("snapshots", []):
        if s["snapshot-id"] == cur:
            return int(s["summary"]["total-records"])
    return 0


def backlog():
    pad = "x" * max(0, RECORD_BYTES - 40)
    batch = 1000
    t0 = time.time()
    for i in range(STREAMS):
        http("PUT", f"/bench/{i}", b"")
    sent = 0
    n = 0
    while n < RECORDS:
        s = n // batch % STREAMS
        k = min(batch, RECORDS - n)
        body = json.dumps([{"n": n + j, "pad": pad} for j in range(k)], separators=(",", ":")).encode()
        http("POST", f"/bench/{s}", body)
        sent += len(body)
        n += k
    load_s = time.time() - t0
    print(f"loaded {RECORDS:,} records ({sent / 2**20:.1f} MiB of JSON) into {STREAMS} streams in {load_s:.1f} s")
    t0 = time.time()
    http("PUT", "/__picomq/tables/bench/backlog", {"source": "bench/**", "commitInterval": "1s"})
    while True:
        t = http("GET", "/__picomq/tables/bench/backlog")
        if t.get("snapshot") and t["lagRecords"] == 0 and t["snapshot"]["totalRecords"] == RECORDS:
            break
        time.sleep(0.05)
    secs = time.time() - t0
    x = t["export"]
    m = metrics("bench.backlog")
    mib = x["source_bytes_read"] / 2**20
    reqs = x["puts"] + x["gets"]
    print(f"export: {RECORDS:,} records in {secs:.2f} s = {RECORDS / secs:,.0f} records/s, "
          f"{mib / secs:.1f} MiB/s of source records ({mib:.1f} MiB)")
    print(f"  object-store requests: {x['puts']} PUTs + {x['gets']} GETs = {reqs / mib:.3f} per MiB "
          f"(metric picomq_table_store_requests_per_mib {m.get('picomq_table_store_requests_per_mib', 0):.3f})")
    print(f"  {x['files_written']} data files, {x['bytes_exported'] / 2**20:.1f} MiB of Parquet "
          f"({x['bytes_exported'] / max(1, x['source_bytes_read']):.2f} of the source bytes), "
          f"{x['commits']} commits")


def visibility(interval, samples, table):
    http("PUT", f"/vis-{table}", b"")
    http("PUT", f"/__picomq/tables/bench/{table}", {"source": f"vis-{table}", "commitInterval": interval})
    # The first round makes the table; wait for it.
    while True:
        try:
            table_records("bench", table)
            break
        except Exception:
            time.sleep(0.2)
    delays = []
    for i in range(samples):
        # A random moment within the interval's cycle.
        time.sleep(random.uniform(0, 2 if interval == "1s" else 60))
        t0 = time.time()
        http("POST", f"/vis-{table}", json.dumps([{"i": i}]).encode())
        while table_records("bench", table) < i + 1:
            time.sleep(0.02)
        delays.append(time.time() - t0)
    print(f"append-to-visibility at commitInterval {interval}: {samples} samples, "
          f"mean {statistics.mean(delays):.2f} s, min {min(delays):.2f} s, max {max(delays):.2f} s")


if __name__ == "__main__":
    backlog()
    visibility("1s", VIS_FAST, "fast")
    visibility("1m", VIS_DEFAULT, "default")
