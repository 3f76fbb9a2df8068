#!/usr/bin/env python3
"""Large appends and catch-up reads against any Durable Streams server
(benchmarks/peers.sh, the `bytes` scenario).

One stream is created (PUT), then filled over one keep-alive connection with
sequential POSTs of --append-kib each (one in flight) until it holds --mib MiB:
that is the sequential row. Then it is read from offset=-1 with catch-up GETs,
each following Stream-Next-Offset until Stream-Up-To-Date: once unmeasured (so
that every read after it is warm), then by one reader (--passes times, each
reported), then by --readers readers at once (threads, one connection each; the
figure is their bytes over the wall time from the first GET to the last answer).
Every read must return exactly the bytes appended (checked by length and by the
first and last appended bytes; octet-stream).

With --server-pid: server CPU seconds (utime + stime, /proc/PID/stat) around each
phase, VmHWM and VmRSS (/proc/PID/status) after the last. Prints one JSON object.

  python3 benchmarks/bytes.py http://127.0.0.1:4437/v1/stream --server-pid PID
"""
import argparse
import http.client
import json
import os
import threading
import time
import urllib.parse

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    if not pid:
        return None
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    # fields[0] is the state (field 3); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def status_mib(pid, field):
    """A /proc/PID/status field in MiB: VmHWM (peak RSS) or VmRSS."""
    if not pid:
        return None
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return None


class Conn:
    def __init__(self, url):
        u = urllib.parse.urlsplit(url)
        self.host, self.port, self.base = u.hostname, u.port or 80, u.path.rstrip("/")
        self.c = http.client.HTTPConnection(self.host, self.port, timeout=120)

    def request(self, method, path, body=None, headers=None):
        self.c.request(method, path, body=body, headers=headers or {})
        return self.c.getresponse()


def payload(kib, i):
    # A different byte per append, so that a read can be checked at both ends.
    return bytes([97 + i % 26]) * (kib * 1024)


def read_all(url, path, buf):
    """Catch-up read from the start: (bytes, requests, first byte, last byte)."""
    conn = Conn(url)
    offset, total, requests = "-1", 0, 0
    first = last = None
    view = memoryview(buf)
    while True:
        r = conn.request("GET", f"{path}?offset={urllib.parse.quote(offset, safe='')}")
        requests += 1
        if r.status != 200:
            raise RuntimeError(f"GET {path} offset {offset}: {r.status} {r.read()[:200]!r}")
        n = 0
        while True:
            got = r.readinto(view)
            if not got:
                break
            if first is None:
                first = buf[0]
            last = buf[got - 1]
            n += got
        total += n
        nxt = r.getheader("Stream-Next-Offset")
        done = (r.getheader("Stream-Up-To-Date") or "").lower() == "true"
        if done or nxt is None or (n == 0 and nxt == offset):
            break
        offset = nxt
    conn.c.close()
    return total, requests, first, last


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url", help="base URL streams are created under")
    ap.add_argument("--mib", type=int, default=256, help="stream size (MiB)")
    ap.add_argument("--append-kib", type=int, default=64)
    ap.add_argument("--readers", type=int, default=16)
    ap.add_argument("--passes", type=int, default=3, help="single-reader passes")
    ap.add_argument("--server-pid", type=int)
    ap.add_argument("--label", default="run")
    ap.add_argument("--mark", help="create this file once the warm-up read is done "
                    "(a profiler can start on it)")
    a = ap.parse_args()
    pid = a.server_pid
    conn = Conn(a.url)
    path = f"{conn.base}/bytes-{os.getpid()}-{int(time.time())}"
    ct = {"Content-Type": "application/octet-stream"}
    r = conn.request("PUT", path, headers=ct)
    r.read()
    if r.status not in (200, 201):
        raise SystemExit(f"PUT {path}: {r.status}")

    appends = a.mib * 1024 // a.append_kib
    bodies = [payload(a.append_kib, i) for i in range(26)]
    lat = []
    c0, t0 = cpu_s(pid), time.perf_counter()
    for i in range(appends):
        s = time.perf_counter()
        r = conn.request("POST", path, body=bodies[i % 26], headers=ct)
        r.read()
        lat.append(time.perf_counter() - s)
        if r.status not in (200, 204):
            raise SystemExit(f"POST {path} #{i}: {r.status}")
    wall = time.perf_counter() - t0
    c1 = cpu_s(pid)
    conn.c.close()
    written = appends * a.append_kib * 1024
    lat.sort()
    out = {
        "label": a.label,
        "url": a.url,
        "stream_bytes": written,
        "sequential": {
            "appends": appends,
            "append_bytes": a.append_kib * 1024,
            "secs": wall,
            "mib_per_s": written / 2**20 / wall,
            "append_ms_p50": lat[len(lat) // 2] * 1000,
            "append_ms_p99": lat[int(len(lat) * 0.99)] * 1000,
            "server_cpu_s": None if pid is None else c1 - c0,
        },
    }
    want_first, want_last = 97, 97 + (appends - 1) % 26

    def check(res, who):
        total, _, first, last = res
        if (total, first, last) != (written, want_first, want_last):
            raise SystemExit(f"{who}: read {total} bytes (first {first}, last {last}), "
                             f"want {written} ({want_first}, {want_last})")

    buf = bytearray(4 << 20)
    check(read_all(a.url, path, buf), "warm-up read")
    if a.mark:
        open(a.mark, "w").close()
    single = []
    for _ in range(a.passes):
        c0, t0 = cpu_s(pid), time.perf_counter()
        res = read_all(a.url, path, buf)
        wall = time.perf_counter() - t0
        c1 = cpu_s(pid)
        check(res, "single reader")
        single.append({"secs": wall, "mib_per_s": written / 2**20 / wall, "requests": res[1],
                       "server_cpu_s": None if pid is None else c1 - c0})
    out["catch_up_1"] = single

    results = [None] * a.readers
    start = threading.Barrier(a.readers + 1)

    def reader(k):
        b = bytearray(4 << 20)
        start.wait()
        results[k] = read_all(a.url, path, b)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(a.readers)]
    for t in threads:
        t.start()
    start.wait()
    c0, t0 = cpu_s(pid), time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    c1 = cpu_s(pid)
    for k, res in enumerate(results):
        if res is None:
            raise SystemExit(f"reader {k} failed")
        check(res, f"reader {k}")
    out["catch_up_n"] = {
        "readers": a.readers,
        "secs": wall,
        "mib_per_s": a.readers * written / 2**20 / wall,
        "requests": sum(r[1] for r in results),
        "server_cpu_s": None if pid is None else c1 - c0,
    }
    out["server_vm_hwm_mib"] = status_mib(pid, "VmHWM")
    out["server_rss_mib"] = status_mib(pid, "VmRSS")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
