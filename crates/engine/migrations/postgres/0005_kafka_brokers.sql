-- Each member's Kafka listener as Kafka clients reach it (`--kafka-advertise`,
-- HOST:PORT), published so that every broker's Metadata names every other broker
-- (crates/kafka, docs/kafka.md). NULL: the member serves no Kafka clients.
ALTER TABLE members ADD COLUMN IF NOT EXISTS kafka TEXT;
