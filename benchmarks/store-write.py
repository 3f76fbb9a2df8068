#!/usr/bin/env python3
"""Times one durable object-store write on a local directory the way PicoMQ's
default store does it, paced like a lone append (5 writes/s) so each is an idle write.

- WAL object (what an append waits for): one pwrite at the next offset of a log file
  that already exists (sparse, its name synced when it was made), then fdatasync.
  This is the local store's WAL log (crates/engine/src/store/local_log.rs).
- The same into a reused log: an emptied log made into a new one keeps its blocks,
  so the write allocates none and changes no metadata (what a long-running server's
  WAL does once its first logs have emptied).
- Any other object, and WAL objects before the log existed: object_store's
  LocalFileSystem with fsync, create-only: write a staging file, fsync it, hard-link
  it to its key, unlink the staging file, fsync the directory.

    benchmarks/store-write.py [DIR] [COUNT] [BYTES]   -> p50/p90/p99 in ms, one line each

BYTES (default 200, a lone append's WAL object) sets the object size; at 10240 (a
group commit under load) the sparse log allocates blocks on every write and the
reused one does not.
"""
import os
import sys
import tempfile
import time

base = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="store-write.")
count = int(sys.argv[2]) if len(sys.argv) > 2 else 100
os.makedirs(os.path.join(base, "wal"), exist_ok=True)
size = int(sys.argv[3]) if len(sys.argv) > 3 else 200
payload = os.urandom(size)
stride = -(-size // 256) * 256


def timed(write):
    took = []
    for i in range(count):
        t0 = time.perf_counter()
        write(i)
        took.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.2)
    took.sort()
    q = lambda p: took[min(len(took) - 1, int(p * len(took)))]
    return f"p50 {q(0.5):.2f} ms  p90 {q(0.9):.2f} ms  p99 {q(0.99):.2f} ms  max {took[-1]:.2f} ms"


log = os.open(os.path.join(base, "wal.log"), os.O_CREAT | os.O_RDWR, 0o644)
os.ftruncate(log, 64 << 20)
os.fsync(log)
dfd = os.open(base, os.O_RDONLY)
os.fsync(dfd)
os.close(dfd)


def log_write(i):
    os.pwrite(log, payload, 64 + i * stride)
    os.fdatasync(log)


reused = os.open(os.path.join(base, "reused.log"), os.O_CREAT | os.O_RDWR, 0o644)
blob = os.urandom(1 << 20)
for mib in range(64):
    os.pwrite(reused, blob, mib << 20)
os.fsync(reused)


def reused_write(i):
    os.pwrite(reused, payload, 64 + i * stride)
    os.fdatasync(reused)


def file_write(i):
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


print(f"one local-directory object-store write ({count} idle writes, {len(payload)} B), "
      f"a WAL object (log pwrite + fdatasync): {timed(log_write)}")
print(f"  a WAL object into a reused log (blocks written before): {timed(reused_write)}")
print(f"  any other object (file + fsync + link + directory fsync): {timed(file_write)}")
