//! PicoMQ's integration tests, one module per capability, in one test binary (one
//! link instead of one per file). Servers start in-process from `picomq serve`'s
//! own flags unless a test needs a process (`kill -9`, signals, logs); shared helpers
//! are `picomq-testkit`. `cargo test -p picomq --test it MODULE::` runs one module.

mod abuse_limits;
mod active_stream_limit;
mod append_durability;
mod auth_consumers;
mod auth_logs;
mod auth_matrix;
mod auth_routes;
mod bad_input;
mod bench_command;
mod browser_cors;
mod cli_cycle;
mod cli_tail_restart;
mod cli_tokens;
mod cluster;
mod cluster_identity;
mod cluster_move;
mod cold_reads;
mod compaction;
mod console;
mod consumer_groups;
mod consumer_hardening;
mod gc;
mod graceful_shutdown;
mod group_commit;
mod kafka_bad_input;
mod kafka_cluster;
mod kafka_conn;
mod kafka_transactions;
mod native_api;
mod read_offsets;
mod restart_recovery;
mod s3_store;
mod schemas;
mod sdk;
mod sdk_records;
mod serve_config;
mod server_ops;
mod streams_cheap;
mod subscriptions;
mod tls_serving;
mod trim_retention;
mod ttl_expiry;
