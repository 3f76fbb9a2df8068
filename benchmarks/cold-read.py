#!/usr/bin/env python3
"""Driver for benchmarks/cold-read.sh (standard library only).

    cold-read.py metrics BASE
        Object-store request counters from BASE/metrics as JSON, summed over
        stores and outcomes: {"put", "get", "head", "list", "delete", "copy",
        "wal"} (wal = picomq_wal_objects_written_total); null if BASE has no
        /metrics (the reference server).

    cold-read.py read BASE PATH STREAM MIN MAX CSV [TIMEOUT_S CAP_S]
        Read PATH from offset=-1 with catch-up GETs (no live mode), following
        Stream-Next-Offset until Stream-Up-To-Date: true. Every record must be the
        one cold-read.lua wrote for STREAM, in order, none missing or repeated,
        and there must be MIN..MAX of them (MIN = appends acknowledged, MAX =
        MIN + 1: the append in flight when the writer stopped). One CSV line per request; prints a JSON summary. A request
        gives up after TIMEOUT_S (default 120), the whole read after CAP_S
        (default 600).

    cold-read.py row RUN.json
        One tab-separated table row for cold-read.sh from a run's JSON (which
        the script assembles from the pieces above).
"""
import csv
import http.client
import json
import socket
import statistics
import sys
import time
import urllib.parse

MIB = 1 << 20
OPS = ("put", "get", "head", "list", "delete", "copy")


def connect(base, timeout):
    u = urllib.parse.urlsplit(base)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)


def metrics(base):
    c = connect(base, 30)
    c.request("GET", "/metrics")
    r = c.getresponse()
    text = r.read().decode(errors="replace")
    if r.status != 200 or "picomq_" not in text:
        return None
    out = dict.fromkeys(OPS, 0)
    out["wal"] = 0
    for line in text.splitlines():
        if line.startswith("picomq_object_store_requests_total{"):
            labels, value = line.rsplit(" ", 1)
            for op in OPS:
                if f'op="{op}"' in labels:
                    out[op] += int(float(value))
        elif line.startswith("picomq_wal_objects_written_total "):
            out["wal"] += int(float(line.rsplit(" ", 1)[1]))
    return out


def record(stream, i, size=100):
    """The text cold-read.lua appends as record i of stream."""
    head = '{"s":%d,"i":%d,"pad":"' % (stream, i)
    return head + chr(97 + (stream + i) % 26) * (size - len(head) - 2) + '"}'


def read(base, path, stream, lo, hi, csv_path, timeout=120.0, cap=600.0):
    c = connect(base, timeout)
    offset = "-1"
    n = 0  # records checked so far
    total = 0
    rows = []
    outcome = "up-to-date"
    problem = None
    bodies = []
    t0 = time.perf_counter()
    deadline = t0 + cap
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            outcome = f"gave up at the {cap:g} s cap of the read"
            break
        wait = min(timeout, left)
        c.timeout = wait
        if c.sock is not None:
            c.sock.settimeout(wait)
        start = time.perf_counter()
        try:
            c.request("GET", f"{path}?offset={urllib.parse.quote(offset)}")
            r = c.getresponse()
            body = r.read()
        except (socket.timeout, TimeoutError):
            ms = (time.perf_counter() - start) * 1000
            rows.append([len(rows), offset, "timeout", 0, 0, round(ms, 1), ""])
            if wait < timeout:
                outcome = f"gave up at the {cap:g} s cap of the read, in request {len(rows) - 1}"
            else:
                outcome = f"request {len(rows) - 1} unanswered after {timeout:g} s"
            break
        ms = (time.perf_counter() - start) * 1000
        up_to_date = r.getheader("stream-up-to-date") == "true"
        # Bodies are checked after the read, so the checker's own CPU (a JSON parse
        # and dump per record) is not counted in the read's time.
        bodies.append((len(rows), r.status, body))
        rows.append([len(rows), offset, r.status, len(body), 0, round(ms, 1),
                     "true" if up_to_date else ""])
        total += len(body)
        if r.status != 200:
            outcome = f"HTTP {r.status}: {body[:120]!r}"
            break
        offset = r.getheader("stream-next-offset") or offset
        if up_to_date:
            break
    took = time.perf_counter() - t0
    for i, status, body in bodies:
        if status != 200:
            continue
        try:
            items = json.loads(body) if body else []
        except ValueError as e:
            items = []
            problem = problem or f"request {i}: body is not JSON ({e})"
        for item in items:
            got = json.dumps(item, separators=(",", ":"))
            if problem is None and got != record(stream, n):
                problem = f"record {n}: got {got[:60]}, expected {record(stream, n)[:60]}"
            n += 1
        rows[i][4] = len(items)
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["request", "offset", "status", "bytes", "records", "ms", "up_to_date"])
        w.writerows(rows)
    if problem is None and outcome == "up-to-date" and not lo <= n <= hi:
        problem = f"{n} records, expected {lo}..{hi} (acknowledged, +1 in flight)"
    lat = [r[5] for r in rows]
    print(json.dumps({
        "outcome": outcome,
        "verified": problem is None and outcome == "up-to-date",
        "problem": problem,
        "records": n,
        "acknowledged": lo,
        "at_most": hi,
        "bytes": total,
        "seconds": round(took, 3),
        "mb_per_s": round(total / 1e6 / took, 3) if took > 0 else None,
        "requests": len(rows),
        "request_ms_max": max(lat) if lat else None,
        "request_ms_p50": round(statistics.median(lat), 1) if lat else None,
        "first_request_ms": lat[0] if lat else None,
    }))


def row(run_path):
    run = json.load(open(run_path))
    rd = run["read"]
    written = run["written_bytes"]
    m1, m2, m3, m4 = (run["metrics"][k] for k in ("end_of_write", "before_stop", "after_start", "after_read"))

    def f(v, d=2):
        return "-" if v is None else f"{v:.{d}f}"

    gets_per_mib_read = bg_put = bg_get = None
    if None not in (m1, m2, m3, m4):
        if rd["bytes"]:
            gets_per_mib_read = (m4["get"] - m3["get"]) / (rd["bytes"] / MIB)
        # Counters restart at zero with the process, so the interval from the end
        # of writing to the read is (before_stop - end_of_write) + after_start;
        # a cluster's taker runs on (after_start - end_of_write).
        if run.get("counters_restart", True):
            span = {k: m2[k] - m1[k] + m3[k] for k in m1}
        else:
            span = {k: m3[k] - m1[k] for k in m1}
        bg_put = (span["put"] - span["wal"]) / (written / MIB)
        bg_get = span["get"] / (written / MIB)
    if rd["verified"]:
        check = f"ok ({rd['records']})"
    else:
        check = "FAILED: " + "; ".join(x for x in (rd["problem"], None if rd["outcome"] == "up-to-date" else rd["outcome"]) if x)
    print("\t".join([
        run["target"], run["restart"], str(run["age_s"]),
        f(written / 1e6), f(rd["bytes"] / 1e6), f(rd["mb_per_s"], 3), str(rd["requests"]),
        f(rd["request_ms_max"], 0), f(run["restart_s"]), f(gets_per_mib_read), f(bg_put), f(bg_get), check,
    ]))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "metrics":
        print(json.dumps(metrics(sys.argv[2])))
    elif cmd == "read":
        base, path, stream, lo, hi, csv_path = sys.argv[2:8]
        extra = [float(x) for x in sys.argv[8:10]]
        read(base, path, int(stream), int(lo), int(hi), csv_path, *extra)
    elif cmd == "row":
        row(sys.argv[2])
    else:
        sys.exit(__doc__)
