#!/usr/bin/env python3
"""Times one durable object-store write on a local directory the way PicoMQ's
default store does it (object_store LocalFileSystem with fsync, create-only):
write a staging file, fsync it, hard-link it to its key, unlink the staging file,
fsync the directory. Paced like a lone append (5 writes/s) so each is an idle write.

    benchmarks/store-write.py [DIR] [COUNT]   -> p50/p90/p99 in ms
"""
import os
import sys
import tempfile
import time

base = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="store-write.")
count = int(sys.argv[2]) if len(sys.argv) > 2 else 100
os.makedirs(os.path.join(base, "wal"), exist_ok=True)
payload = os.urandom(200)
took = []
for i in range(count):
    t0 = time.perf_counter()
    staging = os.path.join(base, "wal", f"{i:08}.json#staging")
    final = os.path.join(base, "wal", f"{i:08}.json")
    fd = os.open(staging, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.write(fd, payload)
    os.fsync(fd)
    os.close(fd)
    os.link(staging, final)
    os.unlink(staging)
    dfd = os.open(os.path.join(base, "wal"), os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)
    took.append((time.perf_counter() - t0) * 1000)
    time.sleep(0.2)
took.sort()
q = lambda p: took[min(len(took) - 1, int(p * len(took)))]
print(f"one local-directory object-store write ({count} idle writes, {len(payload)} B): "
      f"p50 {q(0.5):.2f} ms  p90 {q(0.9):.2f} ms  p99 {q(0.99):.2f} ms  max {took[-1]:.2f} ms")
