//! The cluster's coordination in Postgres (`migrations/postgres/0002_cluster.sql`):
//! member leases, slot owners, takeovers, job leases and stream ids. Each statement
//! judges leases by the database's `now()` and acts in the same statement, so a
//! decision can never rest on a lease that lapsed between a read and a write.

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};

use crate::cluster::{Coordinator, Joining, MemberRow, MemberState, SlotRow};
use crate::error::{EngineError, Result};

/// A member whose lease holds (`$n` is its epoch).
macro_rules! alive {
    ($n:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM members WHERE epoch = $",
            $n,
            " AND state IN ('live', 'draining') AND lease_expires > now())"
        )
    };
}

pub struct PostgresCoordinator {
    pool: PgPool,
}

impl PostgresCoordinator {
    pub fn new(pool: PgPool) -> PostgresCoordinator {
        PostgresCoordinator { pool }
    }
}

fn member_row(r: &PgRow) -> Result<MemberRow> {
    let state: &str = r.get(3);
    Ok(MemberRow {
        epoch: r.get::<i64, _>(0) as u64,
        node_id: r.get(1),
        advertise: r.get(2),
        state: MemberState::parse(state)
            .ok_or_else(|| EngineError::Internal(format!("member state {state:?} unknown")))?,
        lease_left_ms: r.get(4),
        sealer: r.get::<Option<i64>, _>(5).map(|e| e as u64),
        applied_seq: r.get::<i64, _>(6) as u64,
        joined_unix_ms: r.get::<i64, _>(7) as u64,
        kafka: r.get(8),
    })
}

fn slot_row(r: &PgRow) -> SlotRow {
    SlotRow {
        slot: r.get::<i32, _>(0) as u32,
        owner: r.get::<Option<i64>, _>(1).map(|e| e as u64),
        generation: r.get::<i64, _>(2) as u64,
    }
}

const MEMBER_COLUMNS: &str = "epoch, node_id, advertise, state, \
     (EXTRACT(EPOCH FROM (lease_expires - now())) * 1000)::BIGINT, sealer, applied_seq, \
     (EXTRACT(EPOCH FROM joined_at) * 1000)::BIGINT, kafka";

#[async_trait]
impl Coordinator for PostgresCoordinator {
    async fn max_epoch(&self) -> Result<u64> {
        let r = sqlx::query("SELECT COALESCE(MAX(epoch), 0) FROM members")
            .fetch_one(&self.pool)
            .await?;
        Ok(r.get::<i64, _>(0) as u64)
    }

    async fn join(&self, m: &Joining) -> Result<()> {
        sqlx::query(
            "INSERT INTO members (epoch, node_id, advertise, state, lease_expires, kafka) \
             VALUES ($1, $2, $3, 'live', now() + $4 * interval '1 millisecond', $5)",
        )
        .bind(m.epoch as i64)
        .bind(&m.node_id)
        .bind(&m.advertise)
        .bind(m.lease_ms as i64)
        .bind(&m.kafka)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn renew(&self, epoch: u64, lease_ms: u64) -> Result<Option<MemberState>> {
        let row = sqlx::query(
            "UPDATE members SET lease_expires = now() + $2 * interval '1 millisecond' \
             WHERE epoch = $1 AND state IN ('live', 'draining') RETURNING state",
        )
        .bind(epoch as i64)
        .bind(lease_ms as i64)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.and_then(|r| MemberState::parse(r.get(0))))
    }

    async fn set_state(&self, epoch: u64, state: MemberState) -> Result<bool> {
        let sql = match state {
            MemberState::Live | MemberState::Draining => {
                "UPDATE members SET state = $2, changed_at = now() \
                 WHERE epoch = $1 AND state IN ('live', 'draining')"
            }
            MemberState::Left => {
                "UPDATE members SET state = $2, changed_at = now() \
                 WHERE epoch = $1 AND state IN ('live', 'draining') \
                 AND NOT EXISTS (SELECT 1 FROM slots WHERE owner = $1)"
            }
            MemberState::Sealing | MemberState::Replayed => {
                return Err(EngineError::Internal(
                    "only a takeover seals a member".into(),
                ))
            }
        };
        let done = sqlx::query(sql)
            .bind(epoch as i64)
            .bind(state.as_str())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn members(&self) -> Result<Vec<MemberRow>> {
        let sql = format!("SELECT {MEMBER_COLUMNS} FROM members ORDER BY epoch");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(member_row).collect()
    }

    async fn slots(&self) -> Result<Vec<SlotRow>> {
        let rows = sqlx::query("SELECT slot, owner, generation FROM slots ORDER BY slot")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(slot_row).collect())
    }

    async fn slot(&self, slot: u32) -> Result<SlotRow> {
        let row = sqlx::query("SELECT slot, owner, generation FROM slots WHERE slot = $1")
            .bind(slot as i32)
            .fetch_one(&self.pool)
            .await?;
        Ok(slot_row(&row))
    }

    async fn claim(&self, epoch: u64, slots: &[u32]) -> Result<Vec<SlotRow>> {
        let slots: Vec<i32> = slots.iter().map(|s| *s as i32).collect();
        let sql = concat!(
            "UPDATE slots s SET owner = $1, generation = generation + 1 ",
            "WHERE slot = ANY($2) AND (owner IS NULL ",
            "OR NOT EXISTS (SELECT 1 FROM members m WHERE m.epoch = s.owner ",
            "AND m.state NOT IN ('replayed', 'left'))) ",
            "AND ",
            alive!("1"),
            " RETURNING slot, owner, generation"
        );
        let rows = sqlx::query(sql)
            .bind(epoch as i64)
            .bind(&slots)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(slot_row).collect())
    }

    async fn hand_over(&self, from: u64, slot: u32, to: Option<u64>) -> Result<Option<SlotRow>> {
        let sql = concat!(
            "UPDATE slots SET owner = $3, generation = generation + 1 ",
            "WHERE slot = $2 AND owner = $1 AND ($3::BIGINT IS NULL OR EXISTS (SELECT 1 FROM members ",
            "WHERE epoch = $3 AND state = 'live' AND lease_expires > now())) ",
            "RETURNING slot, owner, generation"
        );
        let row = sqlx::query(sql)
            .bind(from as i64)
            .bind(slot as i32)
            .bind(to.map(|e| e as i64))
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.as_ref().map(slot_row))
    }

    async fn begin_takeover(&self, me: u64, dead: u64) -> Result<Option<u64>> {
        let sql = concat!(
            "UPDATE members SET state = 'sealing', sealer = $1, changed_at = now() ",
            "WHERE epoch = $2 AND $1 <> $2 AND (",
            "(state IN ('live', 'draining') AND lease_expires < now()) ",
            // An earlier incarnation of the same node (see `Membership::take_over_dead`).
            "OR (state IN ('live', 'draining') AND epoch < $1 AND EXISTS (SELECT 1 FROM members n ",
            "WHERE n.epoch = $1 AND n.node_id = members.node_id AND n.advertise = members.advertise)) ",
            "OR (state = 'sealing' AND (sealer = $1 OR sealer IS NULL OR NOT EXISTS (",
            "SELECT 1 FROM members t WHERE t.epoch = members.sealer ",
            "AND t.state IN ('live', 'draining') AND t.lease_expires > now())))) ",
            "AND ",
            alive!("1"),
            " RETURNING applied_seq"
        );
        let row = sqlx::query(sql)
            .bind(me as i64)
            .bind(dead as i64)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.get::<i64, _>(0) as u64))
    }

    async fn finish_takeover(&self, me: u64, dead: u64) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "UPDATE members SET state = 'replayed', changed_at = now() \
             WHERE epoch = $2 AND state = 'sealing' AND sealer = $1",
        )
        .bind(me as i64)
        .bind(dead as i64)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() != 1 {
            return Err(EngineError::Unavailable(format!(
                "the takeover of member {dead} passed to another member"
            )));
        }
        sqlx::query("UPDATE slots SET owner = NULL, generation = generation + 1 WHERE owner = $1")
            .bind(dead as i64)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn hold_job(&self, job: &str, epoch: u64, lease_ms: u64) -> Result<bool> {
        let row = sqlx::query(
            "INSERT INTO jobs (name, holder, expires) VALUES ($1, $2, now() + $3 * interval '1 millisecond') \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires = excluded.expires \
             WHERE jobs.holder = excluded.holder OR jobs.expires < now() RETURNING holder",
        )
        .bind(job)
        .bind(epoch as i64)
        .bind(lease_ms as i64)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.is_some())
    }

    async fn cluster_key(&self) -> Result<String> {
        let row = sqlx::query("SELECT key FROM cluster_key")
            .fetch_one(&self.pool)
            .await?;
        Ok(row.get(0))
    }

    async fn reserve_ids(&self, n: u64) -> Result<u64> {
        let row = sqlx::query("UPDATE stream_ids SET next = next + $1 RETURNING next - $1")
            .bind(n as i64)
            .fetch_one(&self.pool)
            .await?;
        Ok(row.get::<i64, _>(0) as u64)
    }
}
