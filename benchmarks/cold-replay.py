#!/usr/bin/env python3
"""Driver for benchmarks/cold-replay.sh (standard library only).

    cold-replay.py write  BASE STREAM MIB   append MIB MiB in 256 KiB records from
                                            16 concurrent connections
    cold-replay.py replay BASE STREAM       read STREAM from the start with catch-up
                                            reads; print JSON: bytes, seconds, MiB/s,
                                            object-store GETs (from /metrics)
"""
import http.client
import json
import sys
import threading
import time
import urllib.parse

RECORD = 256 << 10


def conn(base):
    u = urllib.parse.urlsplit(base)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=120)


def gets(base):
    c = conn(base)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("picomq_object_store_requests_total{") and 'op="get"' in line
    )


def write(base, stream, mib):
    c = conn(base)
    c.request("PUT", stream, headers={"content-type": "application/octet-stream"})
    r = c.getresponse()
    r.read()
    assert r.status in (200, 201), r.status
    total = mib * (1 << 20) // RECORD
    lock = threading.Lock()
    sent = [0]

    def worker():
        c = conn(base)
        payload = bytes(range(256)) * (RECORD // 256)
        while True:
            with lock:
                if sent[0] >= total:
                    return
                sent[0] += 1
            c.request("POST", stream, body=payload,
                      headers={"content-type": "application/octet-stream"})
            r = c.getresponse()
            r.read()
            assert r.status == 204, (r.status, r.read())

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    print(json.dumps({"written_mib": mib, "seconds": round(took, 2),
                      "mib_per_s": round(mib / took, 1)}))


def replay(base, stream):
    before = gets(base)
    c = conn(base)
    offset = "-1"
    total = 0
    t0 = time.perf_counter()
    while True:
        c.request("GET", f"{stream}?offset={offset}")
        r = c.getresponse()
        body = r.read()
        assert r.status == 200, (r.status, body[:200])
        total += len(body)
        offset = r.getheader("stream-next-offset")
        if r.getheader("stream-up-to-date") == "true":
            break
    took = time.perf_counter() - t0
    n = gets(base) - before
    mib = total / (1 << 20)
    print(json.dumps({"bytes": total, "seconds": round(took, 2),
                      "mib_per_s": round(mib / took, 1), "gets": int(n),
                      "gets_per_mib": round(n / mib, 3)}))


if __name__ == "__main__":
    cmd, base, stream = sys.argv[1], sys.argv[2], sys.argv[3]
    if cmd == "write":
        write(base, stream, int(sys.argv[4]))
    else:
        replay(base, stream)
