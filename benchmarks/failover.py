#!/usr/bin/env python3
"""Failover time of a PicoMQ cluster behind a load balancer, and what it kept.

    failover.py LB_URL KILLS NODE_PIDS_FILE RESTART_CMD_DIR

Writers append to STREAMS streams through the load balancer (one request at a
time per stream, THREADS threads). Each round kills one node with SIGKILL (the
one serving the most of those streams, read from `picomq-served-by`), and
measures, for every stream that node served, the time from the kill to the
stream's first acknowledged append: the failover time of that stream. The round's
figure is the slowest stream's. Then the node is started again (its command is in
RESTART_CMD_DIR/nodeN.cmd, its pid written to RESTART_CMD_DIR/nodeN.pid) and the
cluster given time to rebalance before the next round.

At the end every stream is read back: each acknowledged record must be there, in
order, once (plain appends that timed out may have landed without an answer, so
unacknowledged extras are counted, not failed). Prints one tab-separated line per
round and a summary; exits 1 if anything acknowledged is missing.
"""
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

STREAMS = int(os.environ.get("STREAMS", "48"))
THREADS = int(os.environ.get("THREADS", "16"))
SETTLE = float(os.environ.get("SETTLE", "12"))
TIMEOUT = 15.0


def conn_for(url):
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=TIMEOUT)


class Writer:
    def __init__(self, base, names):
        self.base = base
        self.names = names
        self.acked = {n: [] for n in names}
        self.last_ok = {n: 0.0 for n in names}
        self.served_by = {n: "" for n in names}
        self.ok_after = {}  # name -> first ack time after a mark
        self.mark = None
        self.stop = False
        self.lock = threading.Lock()
        self.errors = 0

    def run(self, mine):
        conn = None
        seq = {n: 0 for n in mine}
        while not self.stop:
            for n in mine:
                if self.stop:
                    break
                body = f"{n}:{seq[n]};".encode()
                try:
                    if conn is None:
                        conn = conn_for(self.base)
                    conn.request("POST", f"/v1/stream/{n}", body, {"content-type": "text/plain"})
                    r = conn.getresponse()
                    r.read()
                    status, served = r.status, r.getheader("picomq-served-by") or ""
                    if r.getheader("connection", "").lower() == "close":
                        conn.close()
                        conn = None
                except Exception:
                    status, served = None, ""
                    if conn is not None:
                        conn.close()
                    conn = None
                now = time.monotonic()
                if status == 204:
                    with self.lock:
                        self.acked[n].append(seq[n])
                        self.last_ok[n] = now
                        self.served_by[n] = served
                        if self.mark is not None and n not in self.ok_after and now > self.mark:
                            self.ok_after[n] = now
                    seq[n] += 1
                else:
                    with self.lock:
                        self.errors += 1
                    # A lost answer may still have landed: move on to a new number
                    # so a record is never sent twice under one number.
                    seq[n] += 1
                    time.sleep(0.05)


def request(base, method, path, body=b"", headers=None):
    c = conn_for(base)
    c.request(method, path, body, headers or {})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data, r


def read_all(base, name):
    out = b""
    offset = "-1"
    for _ in range(100000):
        status, data, r = request(base, "GET", f"/v1/stream/{name}?offset={offset}")
        if status != 200:
            raise RuntimeError(f"read {name}: {status} {data[:200]!r}")
        out += data
        nxt = r.getheader("stream-next-offset")
        if r.getheader("stream-up-to-date") == "true" or nxt == offset:
            return out
        offset = nxt
    raise RuntimeError("read did not end")


def main():
    base, kills, cmd_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    names = [f"failover-{os.getpid()}-{i}" for i in range(STREAMS)]
    for n in names:
        for _ in range(50):
            try:
                status, data, _ = request(base, "PUT", f"/v1/stream/{n}", b"", {"content-type": "text/plain"})
            except Exception:
                status = None
            if status in (200, 201):
                break
            time.sleep(0.2)
        else:
            sys.exit(f"cannot create {n}")
    w = Writer(base, names)
    threads = [threading.Thread(target=w.run, args=(names[i::THREADS],), daemon=True) for i in range(THREADS)]
    for t in threads:
        t.start()
    time.sleep(3)
    nodes = sorted(f[:-4] for f in os.listdir(cmd_dir) if f.endswith(".cmd"))
    rounds = []
    print("round\tkilled\tstreams\tfailover p50 s\tfailover max s\terrors", flush=True)
    for k in range(kills):
        with w.lock:
            counts = {}
            for n, s in w.served_by.items():
                counts[s] = counts.get(s, 0) + 1
        victim = max(nodes, key=lambda node: counts.get(node, 0))
        theirs = [n for n, s in w.served_by.items() if s == victim]
        pid = int(open(f"{cmd_dir}/{victim}.pid").read())
        errors_before = w.errors
        with w.lock:
            w.ok_after = {}
            w.mark = time.monotonic()
            t0 = w.mark
        os.kill(pid, signal.SIGKILL)
        deadline = t0 + 60
        while time.monotonic() < deadline:
            with w.lock:
                if all(n in w.ok_after for n in theirs):
                    break
            time.sleep(0.05)
        with w.lock:
            times = [w.ok_after.get(n, deadline) - t0 for n in theirs]
            w.mark = None
        p50 = statistics.median(times) if times else 0.0
        worst = max(times) if times else 0.0
        rounds.append((p50, worst))
        print(f"{k + 1}\t{victim}\t{len(theirs)}\t{p50:.2f}\t{worst:.2f}\t{w.errors - errors_before}", flush=True)
        # Back in: the same command (same node id and data directory).
        cmd = open(f"{cmd_dir}/{victim}.cmd").read()
        log = open(f"{cmd_dir}/{victim}.log", "ab")
        p = subprocess.Popen(["bash", "-c", cmd], stdout=log, stderr=log, start_new_session=True)
        open(f"{cmd_dir}/{victim}.pid", "w").write(str(p.pid))
        time.sleep(SETTLE)
    w.stop = True
    for t in threads:
        t.join(timeout=TIMEOUT + 5)
    missing = extra = dup = 0
    acked_total = 0
    for n in names:
        body = read_all(base, n).decode()
        got = [int(x.split(":")[1]) for x in body.split(";") if x]
        acked_total += len(w.acked[n])
        present = set(got)
        lost = [s for s in w.acked[n] if s not in present]
        if lost:
            print(f"{n}: {len(lost)} acknowledged records missing, first {lost[:5]}, "
                  f"served last by {w.served_by.get(n, '?')}", flush=True)
        missing += len(lost)
        dup += len(got) - len(present)
        extra += len(present - set(w.acked[n]))
        if got != sorted(got):
            at = next(i for i in range(1, len(got)) if got[i] < got[i - 1])
            print(f"{n}: records out of order at record {at}: ... {got[max(0, at - 3):at + 3]} ...", flush=True)
            missing += 1
    p50s = [r[0] for r in rounds]
    maxes = [r[1] for r in rounds]
    summary = {
        "kills": kills,
        "streams": STREAMS,
        "failover_p50_s": round(statistics.median(p50s), 2) if p50s else None,
        "failover_max_s": round(max(maxes), 2) if maxes else None,
        "slowest_stream_p50_s": round(statistics.median(maxes), 2) if maxes else None,
        "acknowledged": acked_total,
        "missing": missing,
        "duplicated": dup,
        "unacknowledged_landed": extra,
    }
    print(json.dumps(summary), flush=True)
    sys.exit(1 if missing or dup else 0)


if __name__ == "__main__":
    main()
