#!/usr/bin/env python3
"""Produce and consume throughput of any Kafka broker through librdkafka
(confluent-kafka), for benchmarks/kafka.sh.

The topic (one partition) is created through the admin API unless it exists. Then
--records records of --record-bytes each are produced to partition 0 with acks=all
(linger.ms=5, compression off, a queue large enough never to block for long): the
figure is records over the wall time from the first produce() to the last delivery
report; the ack latency of each record is librdkafka's own (Message.latency(): from
produce() to the delivery report). Then an assigned consumer (no group) reads them
all back from offset 0: records over the wall time from assign() to the last record.
Every delivery must succeed and every record come back, in order, at its length.

With --server-pid: the broker's CPU seconds (utime + stime, /proc/PID/stat) in each
phase; with --store-pid the object store's too, and the client's own (this process,
librdkafka's threads included) while producing: on one machine the three share the
cores, so a client that spends a core handing records over caps what is measured.

With --kcat PATH: the same records are produced once more, to a second topic, by
kcat (C, `kcat -P -l FILE`, the same acks/linger settings) running on the
librdkafka that confluent-kafka bundles (kcat is pointed at it with
LD_LIBRARY_PATH; Debian's librdkafka 2.0.2 cannot open a connection to tansu
0.6.0), so the broker is measured with a client that costs a fraction of Python's
per record. Figure: records over kcat's wall time, start to exit (it exits once every
record is acknowledged); the topic must then read back whole. No ack latency: kcat
does not report it.

Prints one line per figure; --json FILE also writes them as one JSON object.

  python3 benchmarks/kafka_bench.py 127.0.0.1:9092 --records 200000
"""
import argparse
import glob
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except OSError:
        return None


def own_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_delta(a, b):
    return None if a is None or b is None else b - a


def percentile(sorted_values, p):
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, int(round(p / 100 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


def ensure_topic(bootstrap, topic, timeout):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)],
                              operation_timeout=timeout, request_timeout=timeout)[topic]
    try:
        fut.result(timeout)
    except KafkaException as e:
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    # Until the broker names the partition and its leader.
    deadline = time.time() + timeout
    while time.time() < deadline:
        md = admin.list_topics(topic, timeout=timeout).topics.get(topic)
        if md is not None and md.error is None and 0 in md.partitions and md.partitions[0].leader >= 0:
            return
        time.sleep(0.2)
    raise SystemExit(f"topic {topic} has no leader for partition 0 after {timeout}s")


def produce(args):
    latencies = []
    errors = []

    def delivered(err, msg):
        if err is not None:
            errors.append(str(err))
        else:
            latencies.append(msg.latency())

    p = Producer({
        "bootstrap.servers": args.bootstrap,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "none",
        "queue.buffering.max.messages": max(100000, args.records),
        "queue.buffering.max.kbytes": 4 * 1024 * 1024,
        "message.timeout.ms": args.timeout * 1000,
        "on_delivery": delivered,
    })
    # Metadata first, so the clock starts with a client that knows the leader.
    p.list_topics(args.topic, timeout=args.timeout)
    value = os.urandom(args.record_bytes)
    cpu0 = cpu_seconds(args.server_pid)
    store0 = cpu_seconds(args.store_pid)
    own0 = own_cpu_seconds()
    t0 = time.perf_counter()
    if args.produce_api == "batch":
        # The same records handed over 1,000 at a time (produce_batch: one call
        # into librdkafka per list), so the Python loop costs less of the run.
        batch = [{"value": value} for _ in range(1000)]
        sent = 0
        while sent < args.records:
            chunk = batch[:min(1000, args.records - sent)]
            while True:
                try:
                    queued = p.produce_batch(args.topic, chunk, partition=0)
                    break
                except BufferError:
                    p.poll(0.01)
            if queued != len(chunk):
                raise SystemExit(f"produce_batch queued {queued} of {len(chunk)}: "
                                 f"{[m.get('_error') for m in chunk if '_error' in m][:1]}")
            sent += queued
            p.poll(0)
    else:
        for i in range(args.records):
            while True:
                try:
                    p.produce(args.topic, value, partition=0)
                    break
                except BufferError:
                    p.poll(0.01)
            if i % 1000 == 999:
                p.poll(0)
    enqueued = time.perf_counter() - t0
    left = p.flush(args.timeout)
    elapsed = time.perf_counter() - t0
    cpu1 = cpu_seconds(args.server_pid)
    store1 = cpu_seconds(args.store_pid)
    own1 = own_cpu_seconds()
    if left or errors or len(latencies) != args.records:
        raise SystemExit(f"produce: {left} undelivered, {len(errors)} failed "
                         f"(first: {errors[:1]}), {len(latencies)} acknowledged of {args.records}")
    latencies.sort()
    return {
        "produce_records_per_s": args.records / elapsed,
        "produce_mib_per_s": args.records * args.record_bytes / elapsed / 2**20,
        "produce_s": elapsed,
        "enqueue_s": enqueued,
        "ack_p50_ms": percentile(latencies, 50) * 1000,
        "ack_p99_ms": percentile(latencies, 99) * 1000,
        "ack_max_ms": latencies[-1] * 1000,
        "produce_server_cpu_s": cpu_delta(cpu0, cpu1),
        "produce_store_cpu_s": cpu_delta(store0, store1),
        "produce_client_cpu_s": own1 - own0,
    }


def kcat_produce(args):
    """The same records through kcat on the bundled librdkafka (see the module doc)."""
    import confluent_kafka
    libs = glob.glob(os.path.join(os.path.dirname(os.path.dirname(confluent_kafka.__file__)),
                                  "confluent_kafka.libs", "librdkafka*.so*"))
    want = confluent_kafka.libversion()[0]
    topic = args.topic + "-kcat"
    ensure_topic(args.bootstrap, topic, args.timeout)
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        if libs:
            os.symlink(libs[0], os.path.join(tmp, "librdkafka.so.1"))
            env["LD_LIBRARY_PATH"] = tmp + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        version = subprocess.run([args.kcat, "-V"], env=env, capture_output=True, text=True).stdout
        if f"librdkafka {want} " not in version:
            raise SystemExit(f"kcat does not run on librdkafka {want}: {version.strip()}")
        # One record per line: record_bytes printable bytes and a newline.
        data = os.path.join(tmp, "records")
        line = (b"k" * args.record_bytes) + b"\n"
        with open(data, "wb") as f:
            for _ in range(args.records // 1000):
                f.write(line * 1000)
            f.write(line * (args.records % 1000))
        cmd = [args.kcat, "-P", "-b", args.bootstrap, "-t", topic, "-p", "0",
               "-X", "acks=all", "-X", "linger.ms=5", "-X", "compression.type=none",
               "-X", f"queue.buffering.max.messages={max(100000, args.records)}",
               "-X", f"queue.buffering.max.kbytes={4 * 1024 * 1024}",
               "-X", f"message.timeout.ms={args.timeout * 1000}", "-l", data]
        cpu0 = cpu_seconds(args.server_pid)
        store0 = cpu_seconds(args.store_pid)
        kid0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout * 10)
        elapsed = time.perf_counter() - t0
        cpu1 = cpu_seconds(args.server_pid)
        store1 = cpu_seconds(args.store_pid)
        kid1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode != 0:
        raise SystemExit(f"kcat exited with {run.returncode}: {run.stderr.strip()[-500:]}")
    # Every record back, in order, at its length (read, not taken from the high
    # watermark: tansu 0.6.0's stays 797 records short of what it serves).
    consume(argparse.Namespace(**{**vars(args), "topic": topic}))
    return {
        "kcat_produce_records_per_s": args.records / elapsed,
        "kcat_produce_mib_per_s": args.records * args.record_bytes / elapsed / 2**20,
        "kcat_produce_s": elapsed,
        "kcat_produce_server_cpu_s": cpu_delta(cpu0, cpu1),
        "kcat_produce_store_cpu_s": cpu_delta(store0, store1),
        "kcat_produce_client_cpu_s": (kid1.ru_utime + kid1.ru_stime) - (kid0.ru_utime + kid0.ru_stime),
    }


def consume(args):
    c = Consumer({
        "bootstrap.servers": args.bootstrap,
        "group.id": "kafka-bench-" + uuid.uuid4().hex,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": False,
    })
    cpu0 = cpu_seconds(args.server_pid)
    t0 = time.perf_counter()
    c.assign([TopicPartition(args.topic, 0, 0)])
    got = 0
    next_offset = None
    last_progress = time.time()
    while got < args.records:
        msgs = c.consume(num_messages=10000, timeout=0.5)
        if not msgs:
            if time.time() - last_progress > args.timeout:
                raise SystemExit(f"consume: {got} of {args.records} records after "
                                 f"{args.timeout}s without progress")
            continue
        last_progress = time.time()
        for m in msgs:
            if m.error():
                raise SystemExit(f"consume: {m.error()}")
            if next_offset is not None and m.offset() != next_offset:
                raise SystemExit(f"consume: offset {m.offset()} after {next_offset - 1}")
            if len(m.value()) != args.record_bytes:
                raise SystemExit(f"consume: record at {m.offset()} has {len(m.value())} bytes")
            next_offset = m.offset() + 1
            got += 1
    elapsed = time.perf_counter() - t0
    cpu1 = cpu_seconds(args.server_pid)
    c.close()
    return {
        "consume_records_per_s": got / elapsed,
        "consume_mib_per_s": got * args.record_bytes / elapsed / 2**20,
        "consume_s": elapsed,
        "consume_server_cpu_s": cpu_delta(cpu0, cpu1),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bootstrap", help="HOST:PORT of the broker")
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--record-bytes", type=int, default=1024)
    ap.add_argument("--topic", default="kafka-bench-" + uuid.uuid4().hex[:8])
    ap.add_argument("--label", default="broker")
    ap.add_argument("--server-pid", type=int)
    ap.add_argument("--store-pid", type=int, help="the object store's process, for its CPU seconds")
    ap.add_argument("--kcat", help="also produce the records with this kcat binary (see above)")
    ap.add_argument("--timeout", type=int, default=60, help="seconds without progress before giving up")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--produce-api", choices=["produce", "batch"], default="produce",
                    help="hand records to librdkafka one produce() call each, or 1,000 per produce_batch()")
    args = ap.parse_args()

    ensure_topic(args.bootstrap, args.topic, args.timeout)
    out = {"label": args.label, "bootstrap": args.bootstrap, "topic": args.topic,
           "records": args.records, "record_bytes": args.record_bytes}
    out.update(produce(args))
    out.update(consume(args))
    if args.kcat:
        out.update(kcat_produce(args))

    def line(name, value, unit=""):
        print(f"{args.label}: {name:<18} {value}{unit}", flush=True)

    line("produce records/s", f"{out['produce_records_per_s']:,.0f}")
    line("produce MiB/s", f"{out['produce_mib_per_s']:.1f}")
    line("ack p50", f"{out['ack_p50_ms']:.1f}", " ms")
    line("ack p99", f"{out['ack_p99_ms']:.1f}", " ms")
    line("ack max", f"{out['ack_max_ms']:.1f}", " ms")
    line("produce time", f"{out['produce_s']:.2f} s (all handed to produce() in {out['enqueue_s']:.2f} s)")
    line("consume records/s", f"{out['consume_records_per_s']:,.0f}")
    line("consume MiB/s", f"{out['consume_mib_per_s']:.1f}")
    if out["produce_server_cpu_s"] is not None:
        line("server CPU", f"{out['produce_server_cpu_s']:.1f} s producing, "
             f"{out['consume_server_cpu_s']:.1f} s consuming")
    if out.get("produce_store_cpu_s") is not None:
        line("CPU producing", f"broker {out['produce_server_cpu_s']:.2f} s, store "
             f"{out['produce_store_cpu_s']:.2f} s, client {out['produce_client_cpu_s']:.2f} s")
    if args.kcat:
        line("kcat records/s", f"{out['kcat_produce_records_per_s']:,.0f}")
        if out["kcat_produce_store_cpu_s"] is not None:
            line("kcat CPU", f"broker {out['kcat_produce_server_cpu_s']:.2f} s, store "
                 f"{out['kcat_produce_store_cpu_s']:.2f} s, kcat {out['kcat_produce_client_cpu_s']:.2f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
