// kafkajs (npm) against a running `picomq serve --kafka-listen`: the admin API,
// a gzip-compressed keyed producer with headers, and a consumer group of two
// members that consumes everything and commits; a later member of the group
// resumes at the committed offsets.   node clients.mjs HOST:PORT[,HOST:PORT...]
import { Kafka, CompressionTypes, logLevel } from "kafkajs";

const broker = process.argv[2];
const kafka = new Kafka({ clientId: "kafkajs-ci", brokers: broker.split(","), logLevel: logLevel.NOTHING });
const topic = `kjs-${Math.random().toString(16).slice(2, 10)}`;
const group = `kjs-group-${Math.random().toString(16).slice(2, 8)}`;
const fail = (m) => { console.error(`FAIL kafkajs: ${m}`); process.exit(1); };

const admin = kafka.admin();
await admin.connect();
if (!(await admin.createTopics({ topics: [{ topic, numPartitions: 3 }], waitForLeaders: true }))) {
  fail("createTopics returned false");
}
const md = await admin.fetchTopicMetadata({ topics: [topic] });
if (md.topics[0].partitions.length !== 3) fail(`partitions ${md.topics[0].partitions.length}`);

const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
await producer.connect();
const total = 600;
for (let b = 0; b < total / 100; b++) {
  await producer.send({
    topic,
    acks: -1,
    compression: CompressionTypes.GZIP,
    messages: Array.from({ length: 100 }, (_, i) => {
      const n = b * 100 + i;
      return { key: `k${n % 17}`, value: `v${n}`, headers: { n: `${n}`, tag: "kafkajs" } };
    }),
  });
}
await producer.disconnect();

async function consumeGroup(members, want, timeoutMs) {
  const seen = new Map();
  const consumers = [];
  for (let m = 0; m < members; m++) {
    const c = kafka.consumer({ groupId: group, sessionTimeout: 10000, heartbeatInterval: 500 });
    await c.connect();
    await c.subscribe({ topic, fromBeginning: true });
    await c.run({
      eachMessage: async ({ partition, message }) => {
        const n = Number(message.headers.n.toString());
        if (message.value.toString() !== `v${n}` || message.key.toString() !== `k${n % 17}`
            || message.headers.tag.toString() !== "kafkajs") {
          fail(`record ${n} came back as ${message.key}=${message.value}`);
        }
        seen.set(n, (seen.get(n) ?? 0) + 1);
      },
    });
    consumers.push(c);
  }
  const deadline = Date.now() + timeoutMs;
  while (seen.size < want && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200));
  for (const c of consumers) await c.disconnect();
  return seen;
}

const first = await consumeGroup(2, total, 60000);
if (first.size !== total) fail(`the group consumed ${first.size} of ${total}`);
// More records; a new member of the same group gets only those.
const p2 = kafka.producer();
await p2.connect();
await p2.send({
  topic,
  messages: Array.from({ length: 50 }, (_, i) => {
    const n = total + i;
    return { key: `k${n % 17}`, value: `v${n}`, headers: { n: `${n}`, tag: "kafkajs" } };
  }),
});
await p2.disconnect();
const second = await consumeGroup(1, 50, 60000);
const old = [...second.keys()].filter((n) => n < total);
if (second.size !== 50 || old.length) fail(`the resumed member got ${second.size} records, ${old.length} already committed`);
await admin.deleteTopics({ topics: [topic] });
await admin.disconnect();
console.log(`PASS kafkajs: admin, ${total} gzip records with keys and headers (idempotent), a group of 2 consumed all, a later member resumed at the commits`);
