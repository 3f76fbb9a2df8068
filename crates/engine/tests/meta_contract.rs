//! The metadata contract: every case runs against each `MetaStore`, SQLite (in
//! memory) and Postgres (a database of its own per case, created on the server
//! `PICOMQ_TEST_PG_URL` names and dropped after), so the two stores cannot drift
//! apart. A case takes a `Meta` and knows nothing of the backend.
//!
//! Without `PICOMQ_TEST_PG_URL` the Postgres half fails, saying how to get a server
//! (`picomq_testkit::postgres`): `bash .ci/postgres.sh start DIR; source DIR/env`,
//! then `export PICOMQ_TEST_PG_URL=$PICOMQ_CI_PG_URL`.

#[path = "meta_contract/cases.rs"]
mod cases;

/// Runs every case once per backend: `sqlite::case` and `postgres::case`.
macro_rules! contract {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $case() {
                    let meta = picomq_engine::meta::Meta::open("sqlite::memory:")
                        .await
                        .expect("in-memory SQLite opens");
                    crate::cases::$case(meta).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $case() {
                    picomq_testkit::postgres::with_database(stringify!($case), |url| async move {
                        let meta = picomq_engine::meta::Meta::open(&url)
                            .await
                            .expect("the test database opens");
                        crate::cases::$case(meta).await;
                    })
                    .await;
                }
            )*
        }
    };
}

contract!(
    creates_read_back_by_name_and_id,
    names_are_paged_by_id_and_deleted_ones_stay_listed,
    next_stream_id_only_grows,
    watermark_and_node_epoch,
    appends_fold_into_one_row_per_stream_per_object,
    batched_index_writes_match_op_by_op_effects,
    chunk_rows_indexed_again_are_replaced,
    producer_stamps_keep_the_last_per_producer,
    trims_drop_rows_below_the_start_idempotently,
    retention_finds_the_expired_prefix,
    soft_deletes_keep_rows_for_forks,
    hard_deletes_remove_every_row,
    relocations_replace_the_rows_of_their_span,
    consecutive_relocations_land_in_order,
    stale_relocations_lose_no_rows,
    sequence_numbers_land_in_rows,
    relocations_of_deleted_or_trimmed_streams_keep_nothing,
    wal_rows_by_key_range,
    rows_in_objects_come_grouped_in_key_order,
    live_bytes_and_references_per_object,
    list_pages_live_streams_by_prefix,
    prefixes_match_bytes_not_patterns,
    count_streams_with_prefix_stops_at_the_limit,
    expired_candidates_by_ttl_and_expiry,
    touch_updates_every_stream_in_groups,
    tokens_put_replace_and_revoke,
    server_keys_keep_the_first,
    replaying_a_batch_changes_nothing,
    identity_binds_once_and_rebinds_on_purpose,
);
