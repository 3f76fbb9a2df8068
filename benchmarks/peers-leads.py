#!/usr/bin/env python3
"""Small measurements behind the leads in docs/performance.md ("Against Electric's
durable-streams server"), on one running server (benchmarks/peers-leads.sh starts
each in turn):

  headers  bytes of response head (status line and headers) of a create, an
           append and a catch-up read of a JSON stream
  conns    VmRSS of the server with N idle keep-alive connections, each having
           sent one append, against before they were opened (KiB per connection);
           also VmHWM and VmRSS before the first request (what start-up left)

  python3 benchmarks/peers-leads.py headers URL
  python3 benchmarks/peers-leads.py conns URL --server-pid PID [--conns 512]
Prints one JSON object.
"""
import argparse
import json
import os
import socket
import time
import urllib.parse


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def exchange(sock, method, path, host, body=b"", ctype="application/json"):
    """One HTTP/1.1 request; returns (status, head bytes, body bytes)."""
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n"
    if method in ("PUT", "POST"):
        head += f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
    sock.sendall(head.encode() + b"\r\n" + body)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed")
        buf += chunk
    head_end = buf.index(b"\r\n\r\n") + 4
    lines = buf[:head_end].decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        if line.lower().startswith("content-length:"):
            length = int(line.split(":", 1)[1])
    rest = buf[head_end:]
    while len(rest) < length:
        rest += sock.recv(65536)
    return status, head_end, len(rest)


def connect(url):
    u = urllib.parse.urlsplit(url)
    s = socket.create_connection((u.hostname, u.port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s, f"{u.hostname}:{u.port}", u.path.rstrip("/")


def headers(a):
    s, host, base = connect(a.url)
    path = f"{base}/leads-{os.getpid()}"
    out = {}
    st, h, _ = exchange(s, "PUT", path, host)
    out["create"] = {"status": st, "head_bytes": h}
    rec = b'{"k":"' + b"x" * 90 + b'"}'
    for _ in range(3):
        st, h, _ = exchange(s, "POST", path, host, rec)
    out["append"] = {"status": st, "head_bytes": h}
    st, h, n = exchange(s, "GET", f"{path}?offset=-1", host)
    out["catch_up"] = {"status": st, "head_bytes": h, "body_bytes": n}
    s.close()
    return out


def conns(a):
    pid = a.server_pid
    hwm_start = status_kib(pid, "VmHWM")
    before = status_kib(pid, "VmRSS")
    s, host, base = connect(a.url)
    path = f"{base}/conns-{os.getpid()}"
    exchange(s, "PUT", path, host)
    socks = [s]
    rec = b'{"k":"' + b"x" * 90 + b'"}'
    for _ in range(a.conns - 1):
        socks.append(connect(a.url)[0])
    for c in socks:
        exchange(c, "POST", path, host, rec)
    time.sleep(1)
    after = status_kib(pid, "VmRSS")
    for c in socks:
        c.close()
    return {"conns": a.conns, "hwm_kib_at_start": hwm_start, "rss_kib_before": before,
            "rss_kib_after": after, "kib_per_conn": (after - before) / a.conns}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["headers", "conns"])
    ap.add_argument("url")
    ap.add_argument("--server-pid", type=int)
    ap.add_argument("--conns", type=int, default=512)
    a = ap.parse_args()
    print(json.dumps(headers(a) if a.what == "headers" else conns(a)))


if __name__ == "__main__":
    main()
