#!/usr/bin/env python3
"""Real Kafka clients against a real `picomq serve --kafka-listen`.

librdkafka (confluent-kafka), kafka-python and kcat produce and consume with keys,
headers and every compression codec; records cross between Kafka and HTTP both
ways; topics with many partitions are created, grown, configured, trimmed and
deleted through the admin API; an idempotent producer keeps producing through a
kill -9 of the server and every message lands exactly once; SASL/PLAIN and
OAUTHBEARER take PicoMQ tokens and their scopes.

The same clients then run against three nodes on Postgres and an S3-compatible
store (PICOMQ_KAFKA_CLUSTER_META, PICOMQ_KAFKA_CLUSTER_STORE), each node a broker:
a partition's leader and a group's coordinator are killed with SIGKILL, and SASL
runs with the cluster restarted under --auth required.

Usage: clients.py PICOMQ_BINARY [TEST ...]   (each group of tests starts its own server)
"""

import base64
import faulthandler
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
import uuid
import warnings

import confluent_kafka
from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka.admin import (AlterConfigOpType, ConfigEntry, ConfigResource,
                                   NewPartitions, NewTopic)


def _quiet(cls):
    """librdkafka logs every refused or lost connection, and these tests make many
    on purpose: only critical lines go to the log (failures are asserted)."""
    return lambda conf: cls({"log_level": 2, **conf})


Producer = _quiet(confluent_kafka.Producer)
Consumer = _quiet(confluent_kafka.Consumer)
AdminClient = _quiet(confluent_kafka.admin.AdminClient)

BIN = sys.argv[1]
# The TLS test's server has a self-signed certificate.
UNVERIFIED = ssl._create_unverified_context()
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
BOOTSTRAP_SECRET = "kafka-ci-bootstrap-" + "0123456789abcdef" * 2


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    """One `picomq serve` with a Kafka listener, restartable on the same ports."""

    def __init__(self, *extra):
        self.dir = tempfile.mkdtemp(prefix="picomq-kafka-")
        self.http_port, self.kafka_port = free_port(), free_port()
        self.extra = list(extra)
        self.proc = None
        self.start()

    @property
    def url(self):
        scheme = "https" if "--tls-cert" in self.extra else "http"
        return f"{scheme}://127.0.0.1:{self.http_port}"

    @property
    def bootstrap(self):
        return f"127.0.0.1:{self.kafka_port}"

    def start(self):
        self.log = open(os.path.join(self.dir, "server.log"), "ab")
        self.proc = subprocess.Popen(
            [BIN, "serve", "--listen", f"127.0.0.1:{self.http_port}",
             "--kafka-listen", f"127.0.0.1:{self.kafka_port}",
             "--data-dir", os.path.join(self.dir, "data")] + self.extra,
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                urllib.request.urlopen(self.url + "/readyz", timeout=1, context=UNVERIFIED)
                return
            except Exception:
                time.sleep(0.1)
        raise RuntimeError("server did not become ready:\n" + self.tail())

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self, n=40):
        with open(os.path.join(self.dir, "server.log"), "rb") as f:
            return b"\n".join(f.read().splitlines()[-n:]).decode(errors="replace")

    def http(self, method, path, body=None, headers=None, token=None):
        req = urllib.request.Request(self.url + path, data=body, method=method)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        if token:
            req.add_header("Authorization", "Bearer " + token)
        try:
            with urllib.request.urlopen(req, timeout=30, context=UNVERIFIED) as r:
                return r.status, r.read(), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, e.read(), dict(e.headers)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def produce_one(producer, topic, **kwargs):
    """producer.produce(), waiting while librdkafka's queue is full."""
    while True:
        try:
            producer.produce(topic, **kwargs)
            return
        except BufferError:
            producer.poll(0.05)


def produce_all(producer, messages, flush_timeout=60):
    """Produces (topic, partition|None, key, value, headers, ts) tuples; returns
    the delivery reports as (error, topic, partition, offset) in produce order."""
    reports = [None] * len(messages)

    def cb(i):
        def done(err, msg):
            reports[i] = (err, msg.topic(), msg.partition(), msg.offset())
        return done

    for i, (topic, part, key, value, headers, ts) in enumerate(messages):
        kwargs = dict(key=key, value=value, headers=headers, on_delivery=cb(i))
        if part is not None:
            kwargs["partition"] = part
        if ts is not None:
            kwargs["timestamp"] = ts
        produce_one(producer, topic, **kwargs)
        producer.poll(0)
    left = producer.flush(flush_timeout)
    check(left == 0, f"{left} messages still undelivered after {flush_timeout}s")
    return reports


def consume(bootstrap, topic, partitions, count, timeout=30, extra=None):
    """The first `count` records of `partitions` of `topic`, through an assigned
    (group-less) librdkafka consumer."""
    conf = {"bootstrap.servers": bootstrap, "group.id": "unused-" + uuid.uuid4().hex,
            "enable.auto.commit": False, "enable.auto.offset.store": False}
    conf.update(extra or {})
    c = Consumer(conf)
    c.assign([TopicPartition(topic, p, 0) for p in partitions])
    out = []
    deadline = time.time() + timeout
    while len(out) < count and time.time() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            # Group coordination is not served yet: an assigned consumer does
            # not need it.
            if m.error().code() in (KafkaError._PARTITION_EOF,):
                continue
            print("  consumer says:", m.error())
            continue
        out.append(m)
    c.close()
    check(len(out) == count, f"consumed {len(out)} of {count} records of {topic}")
    return out


def test_librdkafka_codecs_keys_headers(srv):
    """librdkafka: every codec, keys (and null keys), repeated and binary headers,
    client timestamps and a null value (tombstone) survive produce and fetch."""
    topic = "lk-" + uuid.uuid4().hex[:8]
    sent = []
    for codec in CODECS:
        p = Producer({"bootstrap.servers": srv.bootstrap, "compression.type": codec,
                      "linger.ms": 5, "acks": "all"})
        msgs = []
        for i in range(300):
            key = None if i % 10 == 0 else f"key-{i % 7}".encode()
            value = None if i == 299 else f"{codec}-{i}-".encode() + b"x" * (i % 50)
            headers = [("h", b"1"), ("h", b"2"), ("bin", bytes([0, 255, i % 256]))]
            msgs.append((topic, 0, key, value, headers, 1_700_000_000_000 + len(sent) + i))
        reports = produce_all(p, msgs)
        bad = [r for r in reports if r[0] is not None]
        check(not bad, f"{codec}: delivery errors {bad[:3]}")
        offsets = [r[3] for r in reports]
        check(offsets == list(range(len(sent), len(sent) + 300)),
              f"{codec}: offsets {offsets[:3]}..{offsets[-3:]} are not consecutive from {len(sent)}")
        sent += msgs
    got = consume(srv.bootstrap, topic, [0], len(sent))
    for i, (m, s) in enumerate(zip(got, sent)):
        check(m.offset() == i, f"record {i} has offset {m.offset()}")
        check(m.key() == s[2], f"record {i}: key {m.key()!r} != {s[2]!r}")
        check(m.value() == s[3], f"record {i}: value {m.value()!r} != {s[3]!r}")
        check(m.headers() == s[4], f"record {i}: headers {m.headers()} != {s[4]}")
        check(m.timestamp()[1] == s[5], f"record {i}: timestamp {m.timestamp()} != {s[5]}")
    # Watermarks and offsets by time.
    c = Consumer({"bootstrap.servers": srv.bootstrap, "group.id": "wm"})
    lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    check((lo, hi) == (0, len(sent)), f"watermarks {(lo, hi)}")
    now_ms = int(time.time() * 1000)
    future = c.offsets_for_times([TopicPartition(topic, 0, now_ms + 60_000)], timeout=10)[0]
    check(future.offset == -1, f"offset for a future time: {future.offset}")
    past = c.offsets_for_times([TopicPartition(topic, 0, 0)], timeout=10)[0]
    check(past.offset == 0, f"offset for time 0: {past.offset}")
    c.close()
    return f"{len(sent)} records, codecs {', '.join(CODECS)}"


def test_kafka_and_http_are_one_stream(srv):
    """Records produced over Kafka read over HTTP (native records and Durable
    Streams), and records appended over HTTP consumed over Kafka."""
    topic = "mix-" + uuid.uuid4().hex[:8]
    p = Producer({"bootstrap.servers": srv.bootstrap, "acks": "all"})
    produce_all(p, [(topic, 0, b"user-1", b'{"n":1}', [("trace", b"abc"), ("trace", b"def")],
                     1_700_000_000_123)])
    status, body, _ = srv.http("GET", f"/__picomq/streams/{topic}/records?seq=0")
    check(status == 200, f"native read: {status} {body[:200]!r}")
    rec = json.loads(body)["records"][0]
    check(rec["seq"] == 0 and rec["key"] == "user-1" and rec["body"] == '{"n":1}',
          f"native record {rec}")
    check(rec["headers"] == [["trace", "abc"], ["trace", "def"]], f"headers {rec['headers']}")
    check(rec["client_timestamp"] == 1_700_000_000_123, f"timestamp {rec}")
    status, body, headers = srv.http("GET", f"/{topic}?offset=-1")
    check(status == 200 and body == b'{"n":1}', f"Durable Streams read: {status} {body!r}")
    # HTTP appends, consumed over Kafka.
    status, body, _ = srv.http("POST", f"/{topic}", b"from-http",
                               {"Content-Type": "application/octet-stream"})
    check(status in (200, 204), f"DS append: {status} {body!r}")
    records = {"records": [{"body": "native", "key": "k2", "headers": [["a", "b"]],
                            "timestamp": 1_700_000_000_999}]}
    status, body, _ = srv.http("POST", f"/__picomq/streams/{topic}/records",
                               json.dumps(records).encode(), {"Content-Type": "application/json"})
    check(status == 200, f"native append: {status} {body!r}")
    got = consume(srv.bootstrap, topic, [0], 3)
    check(got[1].value() == b"from-http" and got[1].key() is None and got[1].offset() == 1,
          f"DS append over Kafka: {got[1].value()!r} key {got[1].key()!r}")
    check(got[2].value() == b"native" and got[2].key() == b"k2"
          and got[2].headers() == [("a", b"b")] and got[2].timestamp()[1] == 1_700_000_000_999,
          f"native append over Kafka: {got[2].value()!r} {got[2].key()!r} {got[2].headers()}")
    # A live Kafka fetch is woken by an HTTP append.
    c = Consumer({"bootstrap.servers": srv.bootstrap, "group.id": "live",
                  "fetch.wait.max.ms": 5000, "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 3)])
    c.poll(1.0)
    t0 = time.time()
    srv.http("POST", f"/{topic}", b"wake", {"Content-Type": "application/octet-stream"})
    m = None
    while time.time() - t0 < 10:
        m = c.poll(0.2)
        if m is not None and not m.error():
            break
    waited = time.time() - t0
    c.close()
    check(m is not None and m.value() == b"wake", "the live fetch did not see the HTTP append")
    check(waited < 2.0, f"the HTTP append reached the waiting fetch after {waited:.2f}s")
    # A stream whose name is not a topic name is reached through its escaped name.
    srv.http("PUT", "/chat/room.1", b"", {"Content-Type": "application/octet-stream"})
    srv.http("POST", "/chat/room.1", b"hello", {"Content-Type": "application/octet-stream"})
    got = consume(srv.bootstrap, "_s.chat.room_2e1", [0], 1)
    check(got[0].value() == b"hello", "escaped topic name")
    return f"Kafka -> native/DS and DS/native -> Kafka; live fetch woken in {waited * 1000:.0f} ms"


def test_partitions_and_admin(srv):
    """Topics of many partitions: clients' partitioners, CreatePartitions, configs,
    DeleteRecords and DeleteTopics, each partition a stream."""
    admin = AdminClient({"bootstrap.servers": srv.bootstrap})
    topic = "parts-" + uuid.uuid4().hex[:8]
    fs = admin.create_topics([NewTopic(topic, num_partitions=4, replication_factor=1,
                                       config={"retention.ms": "86400000"})])
    fs[topic].result(10)
    fs = admin.create_topics([NewTopic(topic, num_partitions=4, replication_factor=1)])
    try:
        fs[topic].result(10)
        raise AssertionError("creating an existing topic succeeded")
    except confluent_kafka.KafkaException as e:
        check(e.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS, f"second create: {e}")
    md = admin.list_topics(topic, timeout=10)
    check(len(md.topics[topic].partitions) == 4, f"partitions {md.topics[topic].partitions}")
    for p in range(4):
        name = topic if p == 0 else f"{topic}~{p}"
        status, _, _ = srv.http("HEAD", "/" + name)
        check(status == 200, f"partition {p} is stream {name}: HEAD {status}")
    p = Producer({"bootstrap.servers": srv.bootstrap, "linger.ms": 5})
    msgs = [(topic, None, f"key-{i % 40}".encode(), f"v{i}".encode(), None, None)
            for i in range(800)]
    reports = produce_all(p, msgs)
    where = {}
    for (err, _, part, _), m in zip(reports, msgs):
        check(err is None, f"delivery error {err}")
        where.setdefault(m[2], set()).add(part)
    check(all(len(s) == 1 for s in where.values()), "a key landed on two partitions")
    check(len({next(iter(s)) for s in where.values()}) > 1, "every key on one partition")
    got = consume(srv.bootstrap, topic, range(4), 800)
    check(sorted(m.value() for m in got) == sorted(m[3] for m in msgs), "consumed set")
    # Grow to 6 partitions; the new ones are streams too.
    admin.create_partitions([NewPartitions(topic, 6)])[topic].result(10)
    md = admin.list_topics(topic, timeout=10)
    check(len(md.topics[topic].partitions) == 6, "after CreatePartitions")
    status, body, _ = srv.http("GET", f"/__picomq/streams/{topic}~5/info")
    check(status == 200, f"partition 5's stream: {status} {body!r}")
    # Configs: retention.ms is the streams' retention.
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    cfg = admin.describe_configs([res])[res].result(10)
    check(cfg["retention.ms"].value == "86400000", f"retention.ms {cfg['retention.ms'].value}")
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"retention.ms": "3600000"})
    admin.alter_configs([res])[res].result(10)
    cfg = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
    cfg = list(cfg.values())[0].result(10)
    check(cfg["retention.ms"].value == "3600000", "altered retention.ms")
    bad = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("cleanup.policy", "compact",
                    incremental_operation=AlterConfigOpType.SET)])
    try:
        admin.incremental_alter_configs([bad])[bad].result(10)
        raise AssertionError("cleanup.policy=compact was accepted")
    except confluent_kafka.KafkaException as e:
        check(e.args[0].code() == KafkaError.INVALID_CONFIG, f"compact: {e}")
    # DeleteRecords trims partition 0.
    n0 = sum(1 for m in got if m.partition() == 0)
    cut = admin.delete_records([TopicPartition(topic, 0, n0 // 2)])
    low = list(cut.values())[0].result(10)
    check(low.low_watermark == n0 // 2, f"low watermark after DeleteRecords {low.low_watermark}")
    c = Consumer({"bootstrap.servers": srv.bootstrap, "group.id": "x"})
    lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    c.close()
    check((lo, hi) == (n0 // 2, n0), f"watermarks after trim {(lo, hi)}")
    # Delete: every partition's stream goes.
    admin.delete_topics([topic])[topic].result(10)
    for p in range(6):
        name = topic if p == 0 else f"{topic}~{p}"
        status, _, _ = srv.http("HEAD", "/" + name)
        check(status == 404, f"after DeleteTopics, {name}: HEAD {status}")
    return "4 -> 6 partitions, configs, DeleteRecords, DeleteTopics"


def test_idempotent_producer_through_kill9(srv):
    """An idempotent librdkafka producer keeps producing while the server is
    killed with SIGKILL and restarted: every message lands exactly once, in order."""
    topic = "idem-" + uuid.uuid4().hex[:8]
    p = Producer({"bootstrap.servers": srv.bootstrap, "enable.idempotence": True,
                  "linger.ms": 2, "message.timeout.ms": 120000, "retry.backoff.ms": 50,
                  "reconnect.backoff.max.ms": 200})
    total, kill_at = 30000, 12000
    errors = []
    delivered = [0]

    def done(err, msg):
        if err is not None:
            errors.append(err)
        else:
            delivered[0] += 1

    for i in range(total):
        produce_one(p, topic, value=str(i).encode(), key=b"k", on_delivery=done)
        if i % 100 == 0:
            # Paced, so that batches are in flight when the server dies.
            p.poll(0.005)
        if i == kill_at:
            # Kill the server mid-stream, with batches in flight.
            p.poll(0.01)
            status, body, _ = srv.http("GET", f"/__picomq/streams/{topic}/info")
            durable_at_kill = json.loads(body)["next_seq"] if status == 200 else 0
            srv.kill9()
            time.sleep(0.5)
            srv.start()
        p.poll(0)
    left = p.flush(120)
    check(left == 0 and not errors, f"undelivered {left}, errors {errors[:3]}")
    got = consume(srv.bootstrap, topic, [0], total, timeout=60)
    values = [int(m.value()) for m in got]
    check(values == list(range(total)),
          f"not exactly once in order: {len(values)} records, {len(set(values))} distinct")
    check(0 < durable_at_kill < kill_at + 1, f"{durable_at_kill} durable at the kill")
    return (f"{total} messages, SIGKILL when {kill_at + 1} were sent and {durable_at_kill} "
            f"durable; each exactly once, in order")


def test_kafka_python(srv):
    """kafka-python: every codec, keys and headers, produce and consume."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition as KTP
    topic = "kp-" + uuid.uuid4().hex[:8]
    sent = []
    for codec in [None, "gzip", "snappy", "lz4", "zstd"]:
        p = KafkaProducer(bootstrap_servers=srv.bootstrap, compression_type=codec,
                          linger_ms=5, acks="all")
        futures = []
        for i in range(100):
            rec = (f"k{i}".encode(), f"{codec}-{i}".encode(), [("h", f"{i}".encode())])
            futures.append(p.send(topic, key=rec[0], value=rec[1], headers=rec[2]))
            sent.append(rec)
        for f in futures:
            f.get(timeout=30)
        p.close()
    c = KafkaConsumer(bootstrap_servers=srv.bootstrap, enable_auto_commit=False,
                      consumer_timeout_ms=5000)
    c.assign([KTP(topic, 0)])
    c.seek_to_beginning()
    got = []
    for m in c:
        got.append((m.key, m.value, list(m.headers)))
        if len(got) == len(sent):
            break
    c.close()
    check(got == sent, f"kafka-python consumed {len(got)} of {len(sent)}; first diff "
          f"{next(((a, b) for a, b in zip(got, sent) if a != b), None)}")
    return f"{len(sent)} records, codecs none, gzip, snappy, lz4, zstd"


def test_kcat(srv):
    """kcat: keyed produce with headers under every codec, consume to the end."""
    topic = "kcat-" + uuid.uuid4().hex[:8]
    lines = []
    for codec in CODECS:
        data = "".join(f"key{i}:{codec}-value-{i}\n" for i in range(50))
        lines += [f"key{i}|{codec}-value-{i}|h=v{i}" for i in range(50)]
        subprocess.run(["kcat", "-b", srv.bootstrap, "-P", "-t", topic, "-K:", "-z", codec,
                        "-H", "h=v"], input=data.encode(), check=True, timeout=60)
    out = subprocess.run(["kcat", "-b", srv.bootstrap, "-C", "-t", topic, "-o", "beginning",
                          "-e", "-q", "-f", "%k|%s|%h\n"],
                         capture_output=True, check=True, timeout=60).stdout.decode()
    got = out.strip().split("\n")
    check(len(got) == 250, f"kcat consumed {len(got)} of 250")
    for g in got:
        k, v, h = g.split("|")
        check(v.endswith(k[3:]) and h == "h=v", f"kcat record {g!r}")
    return "250 records, codecs " + ", ".join(CODECS)


def token(srv, scopes, namespace=""):
    status, body, _ = srv.http("POST", "/__picomq/tokens",
                               json.dumps({"scopes": scopes, "namespace": namespace}).encode(),
                               {"Content-Type": "application/json"}, token=BOOTSTRAP_SECRET)
    check(status in (200, 201), f"token create: {status} {body!r}")
    secret = json.loads(body)["token"]
    # On a cluster a token made through one node reaches the others within a
    # second: wait until each of them knows it.
    deadline = time.time() + 15
    for node in getattr(srv, "nodes", []):
        while node.http("GET", "/__picomq/streams?limit=1", token=secret)[0] == 401:
            check(time.time() < deadline, "a new token did not reach every node in 15s")
            time.sleep(0.1)
    return secret


def sasl(srv, secret, mechanism="PLAIN"):
    conf = {"bootstrap.servers": srv.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism}
    if mechanism == "PLAIN":
        conf.update({"sasl.username": "picomq", "sasl.password": secret})
    else:
        conf["oauth_cb"] = lambda _config: (secret, time.time() + 3600)
    return conf


def test_sasl_scopes(srv):
    """SASL/PLAIN and OAUTHBEARER with PicoMQ tokens: scopes and namespaces apply
    as on HTTP; without SASL nothing but ApiVersions is served."""
    writer = token(srv, ["create,append,read:orders/**"])
    reader = token(srv, ["read:orders/**"])
    tenant = token(srv, ["all:**"], namespace="tenant-a/")
    # Allowed: produce and consume inside the scope (orders/x is topic _s.orders.x).
    topic = "_s.orders.x"
    p = Producer({**sasl(srv, writer), "acks": "all"})
    reports = produce_all(p, [(topic, 0, b"k", b"v1", None, None)])
    check(reports[0][0] is None, f"scoped produce: {reports[0][0]}")
    got = consume(srv.bootstrap, topic, [0], 1, extra=sasl(srv, reader, "OAUTHBEARER"))
    check(got[0].value() == b"v1", "scoped consume")
    # Refused: outside the scope, and a reader producing.
    for secret, t in [(writer, "elsewhere"), (reader, topic)]:
        p = Producer({**sasl(srv, secret), "acks": "all", "message.timeout.ms": 5000})
        try:
            err = produce_all(p, [(t, 0, None, b"no", None, None)])[0][0]
        except confluent_kafka.KafkaException as e:
            # librdkafka refuses at once when its metadata already says so.
            err = e.args[0]
        check(err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED,
              f"produce to {t} outside the scope: {err}")
    # A transactional id is used with the append scope on its name: the writer may
    # use orders/tx-1 (and commit into orders/x), the reader may not.
    p = Producer({**sasl(srv, writer), "transactional.id": "orders/tx-1"})
    p.init_transactions(30)
    p.begin_transaction()
    produce_one(p, topic, value=b"v2")
    p.commit_transaction(30)
    for secret, tid in [(reader, "orders/tx-1"), (writer, "elsewhere-tx")]:
        p = Producer({**sasl(srv, secret), "transactional.id": tid})
        refused = None
        try:
            p.init_transactions(10)
        except confluent_kafka.KafkaException as e:
            refused = e.args[0]
        check(refused is not None and refused.code() in (
            KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,),
            f"transactional id {tid} outside the scope: {refused}")
    # A namespaced token sees its namespace as the root.
    p = Producer({**sasl(srv, tenant), "acks": "all"})
    produce_all(p, [("events", 0, None, b"tenant", None, None)])
    status, body, _ = srv.http("GET", "/tenant-a/events?offset=-1", token=BOOTSTRAP_SECRET)
    check(status == 200 and body == b"tenant", f"namespaced produce: {status} {body!r}")
    md = AdminClient(sasl(srv, tenant)).list_topics(timeout=10)
    check("events" in md.topics and not any(t.startswith("_s.orders") for t in md.topics),
          f"namespaced listing {sorted(md.topics)}")
    # Wrong password: authentication fails.
    p = Producer({**sasl(srv, "pmq_" + "0" * 64), "message.timeout.ms": 3000})
    reports = produce_all(p, [(topic, 0, None, b"x", None, None)], flush_timeout=20)
    check(reports[0][0] is not None, "a wrong password produced")
    # No SASL at all: the connection is closed after ApiVersions.
    p = Producer({"bootstrap.servers": srv.bootstrap, "message.timeout.ms": 3000})
    reports = produce_all(p, [(topic, 0, None, b"x", None, None)], flush_timeout=20)
    check(reports[0][0] is not None, "an unauthenticated client produced")
    status, body, _ = srv.http("GET", f"/orders/x?offset=-1", token=BOOTSTRAP_SECRET)
    check(body == b"v1v2", f"only the allowed records are there: {body!r}")
    return ("PLAIN and OAUTHBEARER; out-of-scope, read-only, wrong and missing credentials "
            "refused; transactional ids scoped")


def group_member(bootstrap, topic, group, out_path, pace_ms):
    """A consumer group member in its own process: records each value it
    processes, then commits it (at least once)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    c.subscribe([topic])
    with open(out_path, "a") as out:
        while not stop:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                if m.error().code() != KafkaError._PARTITION_EOF:
                    print(f"member {os.getpid()} {time.strftime('%H:%M:%S')}: {m.error()}",
                          file=sys.stderr)
                continue
            out.write(m.value().decode() + "\n")
            out.flush()
            try:
                c.commit(message=m, asynchronous=False)
            except confluent_kafka.KafkaException as e:
                # A rebalance took the partition: its next owner gets the record
                # again (at least once).
                print("member: commit refused:", e.args[0].str(), file=sys.stderr)
            time.sleep(pace_ms / 1000)
    c.close()


def group_scenario(srv, before_kill=lambda: None, after_all=lambda: None):
    """A group of three librdkafka consumers in their own processes on a topic of
    six partitions: one leaves, one is killed with SIGKILL, and every record must
    be processed; then a new member must resume at the committed offsets.
    `before_kill()` runs just before the SIGKILL, `after_all()` once every record
    was processed. Returns (records per member, records processed twice)."""
    topic = "grp-" + uuid.uuid4().hex[:8]
    group = "g-" + uuid.uuid4().hex[:6]
    admin = AdminClient({"bootstrap.servers": srv.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=6, replication_factor=1)])[topic].result(15)
    p = Producer({"bootstrap.servers": srv.bootstrap, "linger.ms": 5})
    total = 3000
    produce_all(p, [(topic, None, str(i).encode(), str(i).encode(), None, None)
                    for i in range(total)])
    work = tempfile.mkdtemp()
    outs = [os.path.join(work, f"m{i}") for i in range(4)]

    def member(i, pace_ms):
        return subprocess.Popen([sys.executable, __file__, BIN, "--group-member", srv.bootstrap,
                                 topic, group, outs[i], str(pace_ms)])

    def seen(paths):
        vals = []
        for path in paths:
            if os.path.exists(path):
                with open(path) as f:
                    vals += [int(x) for x in f.read().split()]
        return vals

    def until_processed(i, n, timeout=90):
        deadline = time.time() + timeout
        while time.time() < deadline and len(seen([outs[i]])) < n:
            time.sleep(0.1)
        check(len(seen([outs[i]])) >= n, f"member {i} processed fewer than {n} in {timeout}s")

    members = [member(i, 3) for i in range(3)]
    try:
        # Each leaves mid-stream: once it has processed some of its share.
        until_processed(0, 100)
        members[0].terminate()          # leaves the group (LeaveGroup)
        members[0].wait(30)
        until_processed(1, len(seen([outs[1]])) + 100)
        before_kill(group)
        members[1].kill()               # SIGKILL: its heartbeats stop
        members[1].wait()
        deadline = time.time() + 120
        while time.time() < deadline and set(seen(outs[:3])) != set(range(total)):
            time.sleep(0.5)
        processed = seen(outs[:3])
        per_member = [len(seen([o])) for o in outs[:3]]
        check(set(processed) == set(range(total)),
              f"processed {len(set(processed))} of {total} distinct (members {per_member})")
        check(all(n > 0 for n in per_member), f"a member processed nothing: {per_member}")
        members[2].terminate()
        members[2].wait(30)
        after_all()
        # New records; a new member resumes where the group committed.
        produce_all(p, [(topic, None, str(i).encode(), str(i).encode(), None, None)
                        for i in range(total, total + 500)])
        members.append(member(3, 0))
        deadline = time.time() + 90
        while time.time() < deadline and len(seen([outs[3]])) < 500:
            time.sleep(0.5)
        time.sleep(1)
        resumed = seen([outs[3]])
        check(sorted(resumed) == list(range(total, total + 500)),
              f"the new member got {len(resumed)} records, "
              f"{len([v for v in resumed if v < total])} of them already committed")
    finally:
        for m in members:
            if m.poll() is None:
                m.terminate()
                m.wait(30)
    return per_member, len(processed) - len(set(processed))


def test_consumer_group_members_come_and_go(srv):
    """A group of three members in their own processes, one leaving and one
    SIGKILLed; the committed offsets survive a SIGKILL of the server."""
    def kill_server():
        srv.kill9()
        srv.start()
    per_member, dupes = group_scenario(srv, before_kill=lambda _group: None,
                                       after_all=kill_server)
    return (f"3000 records over members {per_member} (one left, one SIGKILLed, "
            f"{dupes} redelivered); after a server SIGKILL the next member resumed at "
            "the committed offsets")


def test_consumer_protocol_group(srv):
    """KIP-848 (group.protocol=consumer, the server assigns): two librdkafka members
    split a topic's partitions, one leaves and the other takes them all, and a
    later member resumes at the committed offsets."""
    topic = "k848-" + uuid.uuid4().hex[:8]
    admin = AdminClient({"bootstrap.servers": srv.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=4, replication_factor=1)])[topic].result(10)
    p = Producer({"bootstrap.servers": srv.bootstrap, "linger.ms": 5})

    def produce(lo, hi):
        produce_all(p, [(topic, None, str(i).encode(), str(i).encode(), None, None)
                        for i in range(lo, hi)])

    conf = {"bootstrap.servers": srv.bootstrap, "group.id": "k848-" + uuid.uuid4().hex[:6],
            "group.protocol": "consumer", "auto.offset.reset": "earliest",
            "enable.auto.commit": False}

    def drain(consumers, seen, want, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline and len(set().union(*seen.values())) < want:
            for i, c in consumers.items():
                m = c.poll(0.05)
                if m is not None and not m.error():
                    seen[i].add(int(m.value()))
                    c.commit(message=m, asynchronous=False)
        return set().union(*seen.values())

    produce(0, 1000)
    members = {1: Consumer(conf), 2: Consumer(conf)}
    late = {}
    try:
        return consumer_protocol_rounds(topic, produce, drain, conf, members, late)
    finally:
        for c in [*members.values(), *late.values()]:
            c.close()


def consumer_protocol_rounds(topic, produce, drain, conf, members, late):
    """test_consumer_protocol_group's steps; it closes what is left open."""
    for c in members.values():
        c.subscribe([topic])
    seen = {1: set(), 2: set()}
    got = drain(members, seen, 1000)
    check(got == set(range(1000)), f"two members consumed {len(got)} of 1000")
    split = [len(members[1].assignment()), len(members[2].assignment())]
    check(split == [2, 2], f"partitions split {split}")
    check(seen[1] and seen[2], f"per member {len(seen[1])}, {len(seen[2])}")
    members.pop(2).close()  # leaves: member epoch -1
    produce(1000, 1500)
    seen = {1: set()}
    got = drain(members, seen, 500)
    check(got == set(range(1000, 1500)), f"the remaining member got {len(got)} of 500")
    check(len(members[1].assignment()) == 4, "the remaining member owns every partition")
    members.pop(1).close()
    produce(1500, 1700)
    late[3] = Consumer(conf)
    late[3].subscribe([topic])
    seen = {3: set()}
    got = drain(late, seen, 200)
    time.sleep(1)
    got = drain(late, seen, 10**9, timeout=1)
    late.pop(3).close()
    check(got == set(range(1500, 1700)),
          f"the later member got {len(got)}, {len([v for v in got if v < 1500])} already committed")
    return "2 members split 4 partitions; one left, the other took all; a later member resumed"


def create_topic(srv, topic, partitions):
    admin = AdminClient({"bootstrap.servers": srv.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result(30)


def next_seqs(srv, topic, partitions):
    """Records in each partition's stream, as HTTP readers see them."""
    out = []
    for p in range(partitions):
        name = topic if p == 0 else f"{topic}~{p}"
        status, body, _ = srv.http("GET", f"/__picomq/streams/{name}/info")
        check(status == 200, f"info {name}: {status} {body[:200]!r}")
        out.append(json.loads(body)["next_seq"])
    return out


def test_transactions_commit_and_abort(srv):
    """A transactional producer commits, aborts and commits again over three
    partitions: read_committed and read_uncommitted consumers and HTTP readers see
    the committed records only, and nothing of a transaction before its commit."""
    topic = "txn-" + uuid.uuid4().hex[:8]
    create_topic(srv, topic, 3)
    p = Producer({"bootstrap.servers": srv.bootstrap, "transactional.id": "tx-" + topic,
                  "linger.ms": 5})
    p.init_transactions(30)

    def batch(tag, n):
        for i in range(n):
            produce_one(p, topic, value=f"{tag}-{i}".encode(), key=str(i).encode(),
                        partition=i % 3, headers=[("tag", tag.encode())])
        check(p.flush(30) == 0, "undelivered")

    p.begin_transaction()
    batch("a", 90)
    check(next_seqs(srv, topic, 3) == [0, 0, 0],
          f"an open transaction's records are visible: {next_seqs(srv, topic, 3)}")
    p.commit_transaction(30)
    check(next_seqs(srv, topic, 3) == [30, 30, 30], f"after commit {next_seqs(srv, topic, 3)}")
    p.begin_transaction()
    batch("x", 60)
    p.abort_transaction(30)
    p.begin_transaction()
    batch("b", 30)
    p.commit_transaction(30)
    check(next_seqs(srv, topic, 3) == [40, 40, 40], f"after abort {next_seqs(srv, topic, 3)}")
    for level in ("read_committed", "read_uncommitted"):
        got = consume(srv.bootstrap, topic, [0, 1, 2], 120, extra={"isolation.level": level})
        values = sorted(m.value().decode() for m in got)
        want = sorted([f"a-{i}" for i in range(90)] + [f"b-{i}" for i in range(30)])
        check(values == want, f"{level}: {len(values)} records, aborted ones: "
              f"{[v for v in values if v.startswith('x')][:3]}")
        check(all(m.headers() == [("tag", m.value()[:1])] for m in got), "headers lost")
        # Per partition, offsets are dense and the transaction's order kept.
        for part in range(3):
            mine = [m for m in got if m.partition() == part]
            check([m.offset() for m in mine] == list(range(40)), f"{level} offsets p{part}")
    status, body, _ = srv.http("GET", f"/{topic}?offset=-1")
    check(status == 200 and b"x-" not in body and body.count(b"a-") == 30,
          f"HTTP read: {status} {body[:120]!r}")
    p.flush(5)
    return "commit 90, abort 60, commit 30 over 3 partitions: 120 seen, 0 aborted, 0 early"


def test_transaction_fencing_and_timeout(srv):
    """A second producer with the same transactional id fences the first (its
    open transaction aborted); a transaction left open past its timeout is aborted
    by the coordinator and its producer fenced."""
    topic = "txf-" + uuid.uuid4().hex[:8]
    create_topic(srv, topic, 1)
    conf = {"bootstrap.servers": srv.bootstrap, "transactional.id": "tf-" + topic}
    p1 = Producer(conf)
    p1.init_transactions(30)
    p1.begin_transaction()
    produce_one(p1, topic, value=b"zombie")
    check(p1.flush(30) == 0, "undelivered")
    p2 = Producer(conf)
    p2.init_transactions(30)
    fenced = None
    try:
        p1.commit_transaction(30)
    except confluent_kafka.KafkaException as e:
        fenced = e.args[0]
    check(fenced is not None and fenced.fatal(), f"the fenced producer committed: {fenced}")
    p2.begin_transaction()
    produce_one(p2, topic, value=b"live")
    p2.commit_transaction(30)
    got = consume(srv.bootstrap, topic, [0], 1, extra={"isolation.level": "read_committed"})
    check(got[0].value() == b"live", f"got {got[0].value()!r}")
    # Timeout: 2 s; the coordinator looks every second.
    p3 = Producer({"bootstrap.servers": srv.bootstrap, "transactional.id": "tt-" + topic,
                   "transaction.timeout.ms": 2000})
    p3.init_transactions(30)
    p3.begin_transaction()
    produce_one(p3, topic, value=b"late")
    check(p3.flush(30) == 0, "undelivered")
    time.sleep(4)
    failed = None
    try:
        p3.commit_transaction(30)
    except confluent_kafka.KafkaException as e:
        failed = e.args[0]
    check(failed is not None, "a transaction past its timeout committed")
    check(next_seqs(srv, topic, 1) == [1], f"after the timeout {next_seqs(srv, topic, 1)}")
    return f"fenced: {fenced.name()}; timed out: {failed.name()}"


def eos_worker(bootstrap, src, dst, group, tid):
    """Consume-transform-produce, exactly once, in its own process until killed:
    each batch's output and its input offsets in one transaction. A commit that
    fails is retried or aborted (the consumer rewound to the committed offsets), a
    fenced producer replaced."""
    from confluent_kafka import KafkaException
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "isolation.level": "read_committed", "session.timeout.ms": 10000})
    c.subscribe([src])

    def say(what):
        print(f"eos worker {os.getpid()} {time.strftime('%H:%M:%S')}: {what}", file=sys.stderr)

    def producer():
        p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid,
                      "transaction.timeout.ms": 20000, "linger.ms": 5,
                      "reconnect.backoff.max.ms": 200, "retry.backoff.ms": 50,
                      # librdkafka 2.16's re-bootstrap (all brokers down: a
                      # one-node server killed) can leave send_offsets_to_transaction
                      # waiting for a group coordinator it never asks for again.
                      "metadata.recovery.strategy": "none"})
        while True:
            try:
                p.init_transactions(30)
                return p
            except KafkaException as e:
                say(f"init_transactions: {e.args[0]}")
                if not e.args[0].retriable():
                    raise
                time.sleep(0.5)

    def rewind():
        parts = c.assignment()
        if parts:
            for tp in c.committed(parts, 30):
                c.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))

    p = producer()
    while True:
        msgs = [m for m in c.consume(200, 0.5) if not m.error()]
        if not msgs:
            continue
        try:
            p.begin_transaction()
            for m in msgs:
                produce_one(p, dst, value=b"out-" + m.value(), partition=m.partition())
            p.send_offsets_to_transaction(c.position(c.assignment()),
                                          c.consumer_group_metadata(), 30)
            while True:
                try:
                    p.commit_transaction(30)
                    break
                except KafkaException as e:
                    say(f"commit_transaction: {e.args[0]}")
                    if e.args[0].retriable():
                        continue
                    raise
        except KafkaException as e:
            err = e.args[0]
            say(f"transaction failed: {err}")
            if err.txn_requires_abort():
                try:
                    p.abort_transaction(30)
                except KafkaException as e2:
                    say(f"abort_transaction: {e2.args[0]}")
                    p = producer()
            else:
                p = producer()
            rewind()


def find_coordinator(bootstrap, key, key_type):
    """(host, port) of the coordinator of a group (0) or transactional id (1):
    FindCoordinator v1 by hand (the admin clients here ask only for groups)."""
    import struct
    host, port = bootstrap.split(",")[0].rsplit(":", 1)

    def string(v):
        b = v.encode()
        return struct.pack(">h", len(b)) + b
    body = struct.pack(">hhi", 10, 1, 7) + string("tests") + string(key) + struct.pack(">b", key_type)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        resp = sock.recv(size, socket.MSG_WAITALL)
    at = 4 + 4  # correlation id, throttle time
    error = struct.unpack_from(">h", resp, at)[0]
    at += 2
    n = struct.unpack_from(">h", resp, at)[0]
    at += 2 + max(n, 0)
    at += 4  # node id
    n = struct.unpack_from(">h", resp, at)[0]
    found_host = resp[at + 2:at + 2 + n].decode()
    found_port = struct.unpack_from(">i", resp, at + 2 + n)[0]
    check(error == 0, f"FindCoordinator({key!r}, {key_type}): error {error}")
    return found_host, found_port


def test_exactly_once_through_kill9(srv):
    """Consume-transform-produce with transactions while the server is killed with
    SIGKILL and restarted (on a cluster: the node coordinating the transactions):
    every input record's output is committed exactly once, and the group's
    committed offsets end at the input's end. A worker that stops making progress
    is killed and replaced, as a supervisor would: the new one fences the old."""
    src, dst = "eos-in-" + uuid.uuid4().hex[:6], "eos-out-" + uuid.uuid4().hex[:6]
    create_topic(srv, src, 3)
    create_topic(srv, dst, 3)
    total = 6000
    p = Producer({"bootstrap.servers": srv.bootstrap, "enable.idempotence": True})
    produce_all(p, [(src, i % 3, None, str(i).encode(), None, None) for i in range(total)])
    group, tid = "eos-" + src, "eos-" + src

    def start_worker():
        return subprocess.Popen([sys.executable, __file__, BIN, "--eos-worker", srv.bootstrap,
                                 src, dst, group, tid])
    worker, replaced = start_worker(), 0

    def outputs():
        try:
            return sum(next_seqs(srv, dst, 3))
        except (AssertionError, OSError, ValueError):
            return -1
    deadline = time.time() + 60
    while outputs() < total // 3 and time.time() < deadline:
        time.sleep(0.05)
    done_at_kill = outputs()
    if isinstance(srv, Cluster):
        _, port = find_coordinator(srv.bootstrap, tid, 1)
        victim = srv.node_at(port)
    else:
        victim = srv
    victim.kill9()
    time.sleep(0.5)
    victim.start()
    if isinstance(srv, Cluster):
        srv.settle()
    deadline = time.time() + 240
    last, last_change = -1, time.time()
    while time.time() < deadline:
        now = outputs()
        if now >= total:
            break
        if now != last:
            last, last_change = now, time.time()
        elif time.time() - last_change > 45:
            worker.kill()
            worker.wait()
            worker, replaced = start_worker(), replaced + 1
            last_change = time.time()
        time.sleep(0.2)
    worker.kill()
    worker.wait()
    check(0 < done_at_kill < total, f"{done_at_kill} processed at the kill")
    got = consume(srv.bootstrap, dst, [0, 1, 2], total, timeout=60,
                  extra={"isolation.level": "read_committed"})
    values = sorted(int(m.value()[4:]) for m in got)
    check(values == list(range(total)),
          f"not exactly once: {len(values)} outputs, {len(set(values))} distinct")
    check(sum(next_seqs(srv, dst, 3)) == total, f"extra outputs: {next_seqs(srv, dst, 3)}")
    c = Consumer({"bootstrap.servers": srv.bootstrap, "group.id": group})
    deadline = time.time() + 30
    while True:
        try:
            committed = c.committed([TopicPartition(src, i) for i in range(3)], 30)
            break
        except confluent_kafka.KafkaException as e:
            # A restarted node taking its slots back moves the group's coordinator.
            if time.time() > deadline or e.args[0].code() not in (
                    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                    KafkaError.COORDINATOR_LOAD_IN_PROGRESS):
                raise
            time.sleep(0.5)
    c.close()
    check([tp.offset for tp in committed] == [total // 3] * 3,
          f"committed {[tp.offset for tp in committed]}")
    return (f"{total} records, SIGKILL after {done_at_kill} outputs; every output once; "
            f"{replaced} stalled workers replaced")

class Cluster:
    """Three `picomq serve` nodes on one Postgres database and one bucket prefix,
    each a Kafka broker (PICOMQ_KAFKA_CLUSTER_META, PICOMQ_KAFKA_CLUSTER_STORE)."""

    def __init__(self, meta, store):
        self.base = ["--meta", meta, "--store", store]
        self.admin = None
        self.nodes = [Server(*self.base, "--node-id", f"k{i}") for i in range(3)]
        self.settle()

    def restart_with(self, *extra, admin=None):
        """Stops every node, then starts each again with `extra` flags (`admin`:
        the bootstrap token when they require one)."""
        self.admin = admin
        for i, n in enumerate(self.nodes):
            n.stop()
            n.extra = self.base + ["--node-id", f"k{i}"] + list(extra)
        for n in self.nodes:
            n.start()
        self.settle()

    @property
    def url(self):
        return self.nodes[0].url

    def http(self, *args, **kwargs):
        """An HTTP request through node 0 (it forwards to the stream's owner)."""
        return self.nodes[0].http(*args, **kwargs)

    def settle(self, timeout=60):
        """Waits until three live members share all the slots, each at least three
        quarters of a fair share, and the shares held still for a second (joining
        nodes take their share by hand-over, a few seconds after they start). A
        share still moving moves partition leaders under the next test: a client
        that asked Metadata a moment before is told "not leader"."""
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            status, body, _ = self.nodes[0].http("GET", "/__picomq/nodes", token=self.admin)
            nodes = json.loads(body)["nodes"] if status == 200 else []
            live = [n for n in nodes if n["state"] == "live" and n["kafka"]]
            shares = sorted((n["nodeId"], n["slots"]) for n in live)
            even = (len(shares) == 3 and sum(s for _, s in shares) == 1024
                    and all(s * 4 >= 1024 // 3 * 3 for _, s in shares))
            if even and shares == last:
                return
            last = shares if even else None
            time.sleep(1.0 if even else 0.2)
        raise RuntimeError("the cluster did not settle:\n" + self.tail())

    @property
    def bootstrap(self):
        return ",".join(n.bootstrap for n in self.nodes)

    def node_at(self, port):
        return next(n for n in self.nodes if n.kafka_port == port)

    def stop(self):
        for n in self.nodes:
            n.stop()

    def tail(self, n=15):
        return "\n".join(f"-- k{i}:\n{node.tail(n)}" for i, node in enumerate(self.nodes))


def leaders(admin, topic):
    """partition -> (broker id, broker port) as Metadata says."""
    md = admin.list_topics(topic, timeout=10)
    ports = {b.id: b.port for b in md.brokers.values()}
    return {p.id: (p.leader, ports.get(p.leader)) for p in md.topics[topic].partitions.values()}


def test_cluster_leader_killed(cl):
    """Three brokers: a topic's partitions are led by the nodes owning their
    streams; an idempotent producer keeps producing while the leader of a
    partition is killed with SIGKILL (its partitions move to the survivors):
    every message lands exactly once, in order per partition; records are read
    over HTTP through any node."""
    admin = AdminClient({"bootstrap.servers": cl.nodes[0].bootstrap})
    # A partition's leader is its stream's slot owner: a random name puts all six
    # on one of three brokers once in ~240 topics (3 x 3^-6), a valid layout that
    # leaves no survivor leading anything before the kill. Such a topic is set
    # aside and another created; five in a row would mean the slots are not spread.
    for _ in range(5):
        topic = "cl-" + uuid.uuid4().hex[:8]
        admin.create_topics([NewTopic(topic, num_partitions=6, replication_factor=1)])[topic].result(15)
        md = admin.list_topics(timeout=10)
        check(len(md.brokers) == 3, f"Metadata names {len(md.brokers)} brokers, not 3")
        lead = leaders(admin, topic)
        check(len(lead) == 6, f"{len(lead)} partitions")
        if len({b for b, _ in lead.values()}) >= 2:
            break
    check(len({b for b, _ in lead.values()}) >= 2,
          f"every partition on one broker, five topics in a row: {lead} (expected them spread)")
    # Kafka in, HTTP out, through a node that does not lead the partition.
    p = Producer({"bootstrap.servers": cl.nodes[1].bootstrap})
    produce_all(p, [(topic, 0, b"k", b"hello over kafka", [("h", b"v")], None)])
    leader_port = lead[0][1]
    other = next(n for n in cl.nodes if n.kafka_port != leader_port)
    status, body, _ = other.http("GET", f"/__picomq/streams/{topic}/records?seq=0")
    check(status == 200, f"native read through a non-leader: {status} {body[:200]}")
    rec = json.loads(body)["records"][0]
    check(rec["body"] == "hello over kafka" and rec["key"] == "k",
          f"native record through a non-leader: {rec}")
    # An idempotent producer through the death of partition 0's leader.
    p = Producer({"bootstrap.servers": cl.bootstrap, "enable.idempotence": True,
                  "linger.ms": 5, "message.timeout.ms": 180000, "retry.backoff.ms": 100,
                  "reconnect.backoff.max.ms": 500, "topic.metadata.refresh.interval.ms": 1000})
    total, kill_at = 12000, 4000
    errors, delivered = [], [0]

    def done(err, msg):
        if err is not None:
            errors.append(err)
        else:
            delivered[0] += 1

    victim = cl.node_at(leader_port)
    for i in range(total):
        produce_one(p, topic, value=str(i).encode(), partition=i % 6, on_delivery=done)
        if i % 50 == 0:
            p.poll(0.005)
        if i == kill_at:
            p.poll(0.05)
            victim.kill9()
            killed_at = time.time()
        p.poll(0)
    left = p.flush(180)
    took = time.time() - killed_at
    check(left == 0 and not errors, f"undelivered {left}, errors {errors[:3]}")
    after = leaders(admin, topic)
    check(all(port != leader_port for _, port in after.values()),
          f"the killed node still leads: {after}")
    got = consume(cl.nodes[2].bootstrap if victim is not cl.nodes[2] else cl.nodes[1].bootstrap,
                  topic, range(6), total + 1, timeout=90)
    by_part = {}
    for m in got:
        if m.value() != b"hello over kafka":
            by_part.setdefault(m.partition(), []).append(int(m.value()))
    for part, vals in by_part.items():
        want = [v for v in range(total) if v % 6 == part]
        check(vals == want, f"partition {part}: {len(vals)} records, {len(set(vals))} distinct, "
                            f"in order: {vals == sorted(vals)}")
    victim.start()
    cl.settle()
    return (f"6 partitions over 3 brokers; {total} idempotent messages, partition 0's leader "
            f"SIGKILLed after {kill_at + 1}; all delivered {took:.1f}s after the kill, each "
            "exactly once in order; leaders moved to the survivors")


def test_cluster_group_coordinator_killed(cl):
    """A consumer group of three members on the cluster: one leaves, one is killed
    with SIGKILL, and the node coordinating the group is killed with SIGKILL too:
    every record is processed, and a later member resumes at the commits."""
    killed = []

    def kill_coordinator(group):
        admin = AdminClient({"bootstrap.servers": cl.bootstrap})
        desc = admin.describe_consumer_groups([group])[group].result(10)
        killed.append(cl.node_at(desc.coordinator.port))
        killed[0].kill9()

    def restart():
        killed[0].start()
        cl.settle()
    per_member, dupes = group_scenario(cl, before_kill=kill_coordinator, after_all=restart)
    return (f"3000 records over members {per_member} (one left, one SIGKILLed, the "
            f"coordinating node SIGKILLed, {dupes} redelivered); a later member resumed at "
            "the committed offsets")


def test_kafkajs(srv):
    """kafkajs (npm): admin, an idempotent gzip producer with keys and headers, a
    consumer group of two, a later member resuming at the commits."""
    out = subprocess.run(["node", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                               "kafkajs", "clients.mjs"), srv.bootstrap],
                         capture_output=True, timeout=300)
    text = (out.stdout + out.stderr).decode(errors="replace").strip()
    check(out.returncode == 0, text[-2000:])
    return text.splitlines()[-1].removeprefix("PASS kafkajs: ")


def test_tls(srv):
    """The Kafka listener over TLS, with the server's certificate (--tls-cert)."""
    topic = "tls-" + uuid.uuid4().hex[:8]
    conf = {"bootstrap.servers": srv.bootstrap, "security.protocol": "SSL",
            "ssl.ca.location": srv.tls_ca, "ssl.endpoint.identification.algorithm": "none"}
    reports = produce_all(Producer({**conf, "acks": "all"}),
                          [(topic, 0, b"k", b"over tls", None, None)])
    check(reports[0][0] is None, f"produce over TLS: {reports[0][0]}")
    got = consume(srv.bootstrap, topic, [0], 1, extra=conf)
    check(got[0].value() == b"over tls", "consume over TLS")
    # A plaintext client cannot talk to it.
    p = Producer({"bootstrap.servers": srv.bootstrap, "message.timeout.ms": 3000})
    reports = produce_all(p, [(topic, 0, None, b"x", None, None)], flush_timeout=20)
    check(reports[0][0] is not None, "a plaintext client produced to the TLS listener")
    return "produce and consume over TLS; plaintext refused"


def tls_args():
    d = tempfile.mkdtemp()
    key, cert = os.path.join(d, "key.pem"), os.path.join(d, "cert.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    return ["--tls-cert", cert, "--tls-key", key], cert


def auth_args():
    """Flags for a server that requires tokens, with BOOTSTRAP_SECRET its admin."""
    secret_file = os.path.join(tempfile.mkdtemp(), "bootstrap")
    with open(secret_file, "w") as f:
        f.write(BOOTSTRAP_SECRET)
    return ["--auth", "required", "--bootstrap-token-file", secret_file]


# No test takes this long when it passes: past it, the test is stuck.
TEST_LIMIT_S = 420


# ---- the schema registry (docs/schemas.md) ------------------------------------

def registry(srv, **conf):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    return SchemaRegistryClient({"url": srv.url + "/__picomq/schemas", **conf})


def refused(call, status, code):
    """`call()` fails with the registry's HTTP status and error code."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError
    try:
        call()
    except SchemaRegistryError as e:
        check(e.http_status_code == status and e.error_code == code,
              f"expected {status}/{code}, got {e.http_status_code}/{e.error_code}: {e}")
        return str(e)
    raise AssertionError(f"expected a {status}/{code} refusal")


def produce_refused(srv, topic, value, key=None):
    """Produces one raw record with librdkafka and with kafka-python: the broker
    must refuse it with INVALID_RECORD; returns the broker's message, which
    kafka-python shows (librdkafka reports the code's description only)."""
    from kafka import KafkaProducer
    from kafka.errors import InvalidRecordError
    p = Producer({"bootstrap.servers": srv.bootstrap, "acks": "all",
                  "enable.idempotence": False, "retries": 0})
    [(err, _, _, _)] = produce_all(p, [(topic, 0, key, value, None, None)])
    check(err is not None and err.code() == KafkaError.INVALID_RECORD,
          f"a bad record was not refused: {err}")
    kp = KafkaProducer(bootstrap_servers=srv.bootstrap.split(","), retries=0)
    try:
        kp.send(topic, value=value, key=key, partition=0).get(timeout=30)
        raise AssertionError("kafka-python: a bad record was not refused")
    except InvalidRecordError as e:
        return str(e)
    finally:
        kp.close()


def test_registry_avro(srv):
    """Avro with confluent-kafka's SchemaRegistryClient and serializers: register,
    evolve (a default added passes BACKWARD; a type change is refused 409/40901),
    produce through the Kafka listener, consume with the deserializer; a payload
    that does not decode, or names another subject's schema, is refused."""
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    sr = registry(srv)
    topic = "avro-" + uuid.uuid4().hex[:8]
    create_topic(srv, topic, 1)
    v1 = json.dumps({"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"}, {"name": "item", "type": "string"}]})
    v2 = json.dumps({"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"}, {"name": "item", "type": "string"},
        {"name": "qty", "type": "int", "default": 1}]})
    bad = json.dumps({"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "string"}, {"name": "item", "type": "string"}]})
    subject = f"{topic}-value"
    id1 = sr.register_schema(subject, Schema(v1, "AVRO"))
    # The same schema again: the same id, no new version.
    check(sr.register_schema(subject, Schema(v1, "AVRO")) == id1, "re-registering gave a new id")
    check(sr.test_compatibility(subject, Schema(v2, "AVRO")), "v2 should be compatible")
    check(not sr.test_compatibility(subject, Schema(bad, "AVRO")), "bad should be incompatible")
    id2 = sr.register_schema(subject, Schema(v2, "AVRO"))
    check(id2 != id1, "v2 got v1's id")
    message = refused(lambda: sr.register_schema(subject, Schema(bad, "AVRO")), 409, 40901)
    latest = sr.get_latest_version(subject)
    check(latest.version == 2 and latest.schema_id == id2, f"latest {latest}")
    check(sr.get_versions(subject) == [1, 2], "versions")
    # Produce with the serializer (its own lookup of the latest schema by topic).
    ser = AvroSerializer(sr, v2, conf={"auto.register.schemas": False, "use.latest.version": True})
    ctx = SerializationContext(topic, MessageField.VALUE)
    p = Producer({"bootstrap.servers": srv.bootstrap, "acks": "all"})
    orders = [{"id": i, "item": f"thing-{i}", "qty": i + 1} for i in range(5)]
    reports = produce_all(p, [(topic, 0, None, ser(o, ctx), None, None) for o in orders])
    check(all(r[0] is None for r in reports), f"valid records refused: {reports}")
    # Written with v1 (an old producer): still a version of the subject.
    old = AvroSerializer(sr, v1, conf={"auto.register.schemas": False, "use.latest.version": False})
    reports = produce_all(p, [(topic, 0, None, old({"id": 9, "item": "old"}, ctx), None, None)])
    check(reports[0][0] is None, f"a v1 record was refused: {reports}")
    # Not Avro of this schema: garbage after a valid id, a foreign id, no framing.
    why = produce_refused(srv, topic, b"\0" + id2.to_bytes(4, "big") + b"\xff\xff\xff")
    check(subject in why and "decode" in why, f"refusal text: {why}")
    other = sr.register_schema(f"other-{topic}", Schema('"string"', "AVRO"))
    why = produce_refused(srv, topic, b"\0" + other.to_bytes(4, "big") + b"\x02a")
    check("schemaId" in why, f"foreign id refusal: {why}")
    produce_refused(srv, topic, b"plain bytes")
    des = AvroDeserializer(sr)
    got = [des(m.value(), ctx) for m in consume(srv.bootstrap, topic, [0], 6)]
    check(got[:5] == orders and got[5] == {"id": 9, "item": "old"},
          f"deserialized {got}")
    # A transaction's records are checked when produced; its commit, with a
    # tombstone among them, goes through.
    tp = Producer({"bootstrap.servers": srv.bootstrap, "transactional.id": "sr-" + topic})
    tp.init_transactions(30)
    tp.begin_transaction()
    produce_one(tp, topic, partition=0, value=ser({"id": 10, "item": "t", "qty": 1}, ctx))
    produce_one(tp, topic, partition=0, key=b"gone", value=None)
    tp.commit_transaction(30)
    got = consume(srv.bootstrap, topic, [0], 8, extra={"isolation.level": "read_committed"})
    check(des(got[6].value(), ctx)["id"] == 10 and got[7].value() is None,
          f"transaction: {[m.value() for m in got[6:]]}")
    return f"ids {id1},{id2}; incompatible refused: {message[:60]}...; 6 records through"


def test_registry_json_schema(srv):
    """JSON Schema: the serializer produces through Kafka and the deserializer reads
    back; a stream bound over HTTP (Stream-Schema-Subject) takes valid JSON appends
    and refuses a batch with one bad message (400 naming index, path and rule,
    nothing stored); reads name the subject and version."""
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    sr = registry(srv)
    topic = "json-" + uuid.uuid4().hex[:8]
    create_topic(srv, topic, 1)
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
              "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 8}},
              "required": ["id", "name"], "additionalProperties": False}
    subject = f"{topic}-value"
    sid = sr.register_schema(subject, Schema(json.dumps(schema), "JSON"))
    # Closed model: a new required property breaks BACKWARD, an optional one does not.
    wider = dict(schema, properties=dict(schema["properties"], note={"type": "string"}))
    stricter = dict(schema, required=["id", "name", "note"],
                    properties=dict(schema["properties"], note={"type": "string"}))
    refused(lambda: sr.register_schema(subject, Schema(json.dumps(stricter), "JSON")), 409, 40901)
    sid2 = sr.register_schema(subject, Schema(json.dumps(wider), "JSON"))
    ser = JSONSerializer(json.dumps(wider), sr, conf={"auto.register.schemas": False,
                                                       "use.latest.version": True})
    ctx = SerializationContext(topic, MessageField.VALUE)
    p = Producer({"bootstrap.servers": srv.bootstrap, "acks": "all"})
    reports = produce_all(p, [(topic, 0, None, ser({"id": 1, "name": "a"}, ctx), None, None)])
    check(reports[0][0] is None, f"refused: {reports}")
    why = produce_refused(srv, topic, b"\0" + sid2.to_bytes(4, "big") + b'{"id": "x", "name": "a"}')
    check("/id" in why and "type" in why, f"refusal text: {why}")
    des = JSONDeserializer(json.dumps(wider))
    [m] = consume(srv.bootstrap, topic, [0], 1)
    check(des(m.value(), ctx) == {"id": 1, "name": "a"}, "JSON round trip")
    # HTTP: a JSON stream bound on create.
    stream = "orders/" + uuid.uuid4().hex[:8]
    status, body, _ = srv.http("PUT", f"/{stream}", b"", {
        "Content-Type": "application/json", "Stream-Schema-Subject": subject})
    check(status == 201, f"create bound: {status} {body!r}")
    status, body, _ = srv.http("POST", f"/{stream}", b'[{"id": 1, "name": "ok"}]',
                               {"Content-Type": "application/json"})
    check(status == 204, f"valid append: {status} {body!r}")
    status, body, _ = srv.http("POST", f"/{stream}",
                               b'[{"id": 2, "name": "fine"}, {"id": 3, "name": "far too long"}]',
                               {"Content-Type": "application/json"})
    err = json.loads(body).get("error", {})
    check(status == 400 and err.get("index") == 1 and err.get("path") == "/name"
          and err.get("rule") == "maxLength" and err.get("subject") == subject,
          f"bad batch: {status} {body!r}")
    status, body, headers = srv.http("GET", f"/{stream}?offset=-1")
    check(json.loads(body) == [{"id": 1, "name": "ok"}], f"the refused batch was stored: {body!r}")
    h = {k.lower(): v for k, v in headers.items()}
    check(h.get("stream-schema-subject") == subject and h.get("stream-schema-version") == "2",
          f"read headers {h}")
    status, body, _ = srv.http("GET", f"/__picomq/streams/{stream}/info")
    check(json.loads(body).get("schema") == {"subject": subject, "version": 2}, f"info {body!r}")
    # Unbound, anything JSON goes; bound again, pinned to version 1.
    status, body, _ = srv.http("POST", f"/__picomq/streams/{stream}/schema",
                               json.dumps({"subject": None}).encode(),
                               {"Content-Type": "application/json"})
    check(status == 200 and json.loads(body)["subject"] is None, f"unbind {status} {body!r}")
    status, _, _ = srv.http("POST", f"/{stream}", b'{"anything": true}',
                            {"Content-Type": "application/json"})
    check(status == 204, "unbound append")
    status, body, _ = srv.http("POST", f"/__picomq/streams/{stream}/schema",
                               json.dumps({"subject": subject, "version": 1}).encode(),
                               {"Content-Type": "application/json"})
    check(status == 200 and json.loads(body)["version"] == 1, f"pin {status} {body!r}")
    status, body, _ = srv.http("POST", f"/{stream}", b'{"id": 4, "name": "x", "note": "n"}',
                               {"Content-Type": "application/json"})
    check(status == 400 and json.loads(body)["error"]["rule"] == "additionalProperties",
          f"pinned v1 refuses note: {status} {body!r}")
    return f"ids {sid},{sid2}; Kafka and HTTP appends checked"


def proto_class(package, fields):
    """A protobuf message class built at run time (no protoc): `fields` are
    (name, number, type) with descriptor_pb2 type numbers."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    fdp = descriptor_pb2.FileDescriptorProto()
    fdp.name = f"{package.replace('.', '/')}/order.proto"
    fdp.package = package
    fdp.syntax = "proto3"
    m = fdp.message_type.add()
    m.name = "Order"
    for name, number, t in fields:
        f = m.field.add()
        f.name, f.number, f.type = name, number, t
        f.label = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Order"))


def test_registry_protobuf(srv):
    """Protobuf: the serializer registers the message's file, produces through
    Kafka, the deserializer reads back; a compatible change (a field added) is
    accepted, an incompatible one (int64 to string) refused 409/40901."""
    from google.protobuf import descriptor_pb2 as d
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    sr = registry(srv)
    topic = "proto-" + uuid.uuid4().hex[:8]
    create_topic(srv, topic, 1)
    pkg = "shop.v" + uuid.uuid4().hex[:6]
    Order = proto_class(pkg, [("id", 1, d.FieldDescriptorProto.TYPE_INT64),
                              ("item", 2, d.FieldDescriptorProto.TYPE_STRING)])
    Order2 = proto_class(pkg, [("id", 1, d.FieldDescriptorProto.TYPE_INT64),
                               ("item", 2, d.FieldDescriptorProto.TYPE_STRING),
                               ("qty", 3, d.FieldDescriptorProto.TYPE_INT32)])
    Bad = proto_class(pkg, [("id", 1, d.FieldDescriptorProto.TYPE_STRING)])
    ctx = SerializationContext(topic, MessageField.VALUE)
    ser = ProtobufSerializer(Order, sr, {"use.deprecated.format": False})
    p = Producer({"bootstrap.servers": srv.bootstrap, "acks": "all"})
    reports = produce_all(p, [(topic, 0, None, ser(Order(id=7, item="pen"), ctx), None, None)])
    check(reports[0][0] is None, f"refused: {reports}")
    ser2 = ProtobufSerializer(Order2, sr, {"use.deprecated.format": False})
    reports = produce_all(p, [(topic, 0, None, ser2(Order2(id=8, item="ink", qty=3), ctx),
                               None, None)])
    check(reports[0][0] is None, f"v2 refused: {reports}")
    check(sr.get_versions(f"{topic}-value") == [1, 2], "two versions registered")
    bad = ProtobufSerializer(Bad, sr, {"use.deprecated.format": False})
    refused(lambda: bad(Bad(id="x"), ctx), 409, 40901)
    latest = sr.get_latest_version(f"{topic}-value")
    why = produce_refused(srv, topic, b"\0" + latest.schema_id.to_bytes(4, "big") + b"\0\x0a\xff")
    check("decode" in why, f"refusal text: {why}")
    des = ProtobufDeserializer(Order2, {"use.deprecated.format": False})
    got = [des(m.value(), ctx) for m in consume(srv.bootstrap, topic, [0], 2)]
    check(got[0].id == 7 and got[0].item == "pen" and got[1].qty == 3, f"deserialized {got}")
    return f"2 versions of {pkg}.Order; incompatible refused"


def test_registry_cluster(cl):
    """Three nodes share one registry: schemas registered on different nodes get
    distinct ids, every node answers the same, and a binding made on one node
    checks appends on the stream's owner."""
    from confluent_kafka.schema_registry import Schema
    clients = [registry(n) for n in cl.nodes]
    base = "cl-" + uuid.uuid4().hex[:8]
    ids = {}

    def register_many(n, sr):
        # Every node at once: the ids come from one sequence.
        for i in range(n, 30, 3):
            subject = f"{base}-{i}"
            ids[subject] = sr.register_schema(subject, Schema(json.dumps(
                {"type": "record", "name": f"R{i}", "fields": [{"name": "f", "type": "int"}]}),
                "AVRO"))

    threads = [threading.Thread(target=register_many, args=(n, sr))
               for n, sr in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(len(ids) == 30, f"{len(ids)} of 30 registrations answered")
    check(len(set(ids.values())) == len(ids), f"ids drawn twice: {ids}")
    for sr in clients:
        for subject, sid in ids.items():
            got = sr.get_latest_version(subject)
            check(got.schema_id == sid, f"{subject}: {got.schema_id} != {sid}")
    subject = f"{base}-json"
    clients[1].register_schema(subject, Schema(json.dumps(
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}), "JSON"))
    stream = f"{base}/bound"
    status, body, _ = cl.nodes[2].http("PUT", f"/{stream}", b"", {
        "Content-Type": "application/json", "Stream-Schema-Subject": subject})
    check(status == 201, f"create: {status} {body!r}")
    for n in cl.nodes:
        status, body, _ = n.http("POST", f"/{stream}", b'{"n": 1}', {"Content-Type": "application/json"})
        check(status == 204, f"valid append via {n.url}: {status} {body!r}")
        status, body, _ = n.http("POST", f"/{stream}", b'{"n": "x"}', {"Content-Type": "application/json"})
        check(status == 400, f"invalid append via {n.url}: {status} {body!r}")
    return f"{len(ids)} ids from 3 nodes, all distinct and answered alike"


def hung(name, srv):
    """A test outlived TEST_LIMIT_S: print where every thread is, stop the
    servers and fail now rather than at the job's timeout."""
    print(f"FAIL {name}: still running after {TEST_LIMIT_S}s; the threads:", flush=True)
    faulthandler.dump_traceback(all_threads=True)
    try:
        print("server log:\n" + srv.tail(), flush=True)
        srv.stop()
    finally:
        os._exit(1)


def main():
    if len(sys.argv) > 2 and sys.argv[2] == "--group-member":
        group_member(*sys.argv[3:7], int(sys.argv[7]))
        return
    if len(sys.argv) > 2 and sys.argv[2] == "--eos-worker":
        eos_worker(*sys.argv[3:8])
        return
    # AlterConfigs is deprecated in favour of IncrementalAlterConfigs; both are served.
    warnings.simplefilter("ignore", DeprecationWarning)
    print("confluent-kafka", confluent_kafka.version(), "librdkafka", confluent_kafka.libversion()[0])
    plain = [test_librdkafka_codecs_keys_headers, test_kafka_and_http_are_one_stream,
             test_partitions_and_admin, test_kafka_python, test_kcat,
             test_consumer_group_members_come_and_go, test_consumer_protocol_group,
             test_kafkajs, test_transactions_commit_and_abort,
             test_transaction_fencing_and_timeout, test_registry_avro,
             test_registry_json_schema, test_registry_protobuf]
    wanted = sys.argv[2:]
    failed = 0
    for name, tests, extra in [
        ("plain", plain, []),
        # Every store write takes 20 ms (as S3's do): batches are in flight when
        # the server is killed.
        ("slow store", [test_idempotent_producer_through_kill9, test_exactly_once_through_kill9],
         ["--store-latency", "20ms"]),
        ("auth", [test_sasl_scopes], None),
        ("tls", [test_tls], "tls"),
        # The same clients on three nodes, each a broker; then a partition's leader
        # and a group's coordinator are killed; then SASL, the cluster restarted
        # with --auth required.
        ("cluster", [test_librdkafka_codecs_keys_headers, test_kafka_and_http_are_one_stream,
                     test_partitions_and_admin, test_kafka_python, test_kcat, test_kafkajs,
                     test_transactions_commit_and_abort, test_exactly_once_through_kill9,
                     test_cluster_leader_killed, test_cluster_group_coordinator_killed,
                     test_registry_cluster, test_sasl_scopes], "cluster"),
    ]:
        tests = [t for t in tests if not wanted or t.__name__ in wanted]
        if not tests:
            continue
        if extra == "cluster":
            meta = os.environ.get("PICOMQ_KAFKA_CLUSTER_META")
            store = os.environ.get("PICOMQ_KAFKA_CLUSTER_STORE")
            if not (meta and store):
                print("SKIP cluster tests: PICOMQ_KAFKA_CLUSTER_META and "
                      "PICOMQ_KAFKA_CLUSTER_STORE are not set (.ci/run sets them)")
                continue
            srv, label = Cluster(meta, store), "[cluster] "
        else:
            ca = None
            if extra == "tls":
                extra, ca = tls_args()
            if extra is None:
                extra = auth_args()
            srv, label = Server(*extra), ""
            srv.tls_ca = ca
        try:
            for t in tests:
                if t is test_sasl_scopes and isinstance(srv, Cluster):
                    srv.restart_with(*auth_args(), admin=BOOTSTRAP_SECRET)
                t0 = time.time()
                watchdog = threading.Timer(TEST_LIMIT_S, hung, (t.__name__, srv))
                watchdog.daemon = True
                watchdog.start()
                try:
                    what = t(srv)
                    print(f"PASS {label}{t.__name__} ({time.time() - t0:.1f}s): {what}")
                except Exception:
                    failed += 1
                    print(f"FAIL {label}{t.__name__} ({time.time() - t0:.1f}s)")
                    traceback.print_exc()
                    print("server log:\n" + srv.tail())
                finally:
                    watchdog.cancel()
        finally:
            srv.stop()
    print(f"kafka clients: {'FAILED ' + str(failed) if failed else 'all passed'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
