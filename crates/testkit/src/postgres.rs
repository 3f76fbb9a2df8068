//! A Postgres database per test, on the server `PICOMQ_TEST_PG_URL` names (its role
//! needs CREATEDB): created with a unique name, handed over as a URL, dropped when
//! the test ends, passed or failed. Without the variable a test fails, saying how
//! to get a server: no test is skipped silently.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::FutureExt;
use sqlx::{Connection, PgConnection};

pub const URL_VAR: &str = "PICOMQ_TEST_PG_URL";

/// The server's URL, or a failure that says how to get one.
pub fn server_url() -> String {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "{URL_VAR} is not set: this test needs a Postgres server where it may create \
             databases. Start one with `bash .ci/postgres.sh start DIR; source DIR/env; \
             export {URL_VAR}=$PICOMQ_CI_PG_URL` (Debian's postgresql package, installed \
             if missing), or point {URL_VAR} at a role with CREATEDB."
        ),
    }
}

/// The password in `url`, if it has one (tests check logs never show it).
pub fn password_of(url: &str) -> Option<String> {
    let url = url::Url::parse(url).ok()?;
    url.password().map(String::from)
}

/// A database of this test's own.
pub struct Database {
    /// `postgres://` URL of the database, with the server's credentials.
    pub url: String,
    pub name: String,
}

impl Database {
    /// Creates a database named after `tag`, this process and a counter.
    pub async fn create(tag: &str) -> Database {
        static N: AtomicU64 = AtomicU64::new(0);
        let server = server_url();
        let tag: String = tag
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .take(40)
            .collect();
        let n = N.fetch_add(1, Ordering::Relaxed);
        let name = format!("pmq_{tag}_{}_{n}", std::process::id()).to_lowercase();
        admin(&server, &format!("CREATE DATABASE \"{name}\"")).await;
        let mut url = url::Url::parse(&server).expect("PICOMQ_TEST_PG_URL is a URL");
        url.set_path(&name);
        Database {
            url: url.to_string(),
            name,
        }
    }

    /// A new database holding a copy of this one (`CREATE DATABASE ... TEMPLATE`,
    /// as a restore from a backup would): nobody may be connected to this one.
    pub async fn copy(&self, tag: &str) -> Database {
        let copy = Database::create(tag).await;
        let drop = format!("DROP DATABASE \"{}\"", copy.name);
        admin(&server_url(), &drop).await;
        let sql = format!(
            "CREATE DATABASE \"{}\" TEMPLATE \"{}\"",
            copy.name, self.name
        );
        let mut last = String::new();
        for _ in 0..40 {
            // The nodes' connections may take a moment to close.
            match try_admin(&server_url(), &sql).await {
                Ok(()) => return copy,
                Err(e) => last = e,
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
        panic!("copying database {}: {last}", self.name);
    }

    /// The first column of the first row of `sql` on this database, as text:
    /// `None` for no row, a NULL, or a query that fails (a table not there yet).
    pub async fn scalar(&self, sql: &str) -> Option<String> {
        let mut conn = PgConnection::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connecting to {}: {e}", self.name));
        let row = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
            .fetch_optional(&mut conn)
            .await;
        conn.close().await.ok();
        row.ok().flatten().and_then(|r| {
            sqlx::Row::try_get::<Option<String>, _>(&r, 0)
                .ok()
                .flatten()
        })
    }

    /// Drops the database, closing whatever connections still use it.
    ///
    /// `FORCE` ends the database's other sessions, and a role that is not a
    /// superuser may end only its own: when an autovacuum worker (a superuser's) is
    /// on the database just then, Postgres refuses. That is the server's
    /// housekeeping, not a test's failure: the drop is tried again, and a database
    /// left over is only reported (the throwaway server goes with the run).
    pub async fn drop(self) {
        let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        let mut last = String::new();
        for _ in 0..20 {
            match try_admin(&server_url(), &sql).await {
                Ok(()) => return,
                Err(e) => last = e,
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
        eprintln!("leaving database {} behind: {last}", self.name);
    }
}

/// Runs one statement on the server's own database.
async fn admin(server: &str, sql: &str) {
    try_admin(server, sql)
        .await
        .unwrap_or_else(|e| panic!("{e} (the role needs CREATEDB)"));
}

async fn try_admin(server: &str, sql: &str) -> Result<(), String> {
    let mut conn = PgConnection::connect(server)
        .await
        .map_err(|e| format!("connecting to {URL_VAR}: {e}"))?;
    let done = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
        .execute(&mut conn)
        .await
        .map(drop)
        .map_err(|e| format!("{sql}: {e}"));
    conn.close().await.ok();
    done
}

/// Runs `test` with the URL of a fresh database, then drops the database (also when
/// the test fails, whose panic is then passed on).
pub async fn with_database<F, Fut>(tag: &str, test: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let database = Database::create(tag).await;
    let outcome = AssertUnwindSafe(test(database.url.clone()))
        .catch_unwind()
        .await;
    database.drop().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// The host and port of the server `PICOMQ_TEST_PG_URL` names.
pub fn server_addr() -> std::net::SocketAddr {
    let url = url::Url::parse(&server_url()).expect("PICOMQ_TEST_PG_URL is a URL");
    let host = url.host_str().unwrap_or("127.0.0.1");
    let port = url.port().unwrap_or(5432);
    format!("{host}:{port}")
        .parse()
        .expect("PICOMQ_TEST_PG_URL names an IP address and port")
}

/// `url` with its port replaced by `port` (a database reached through a relay).
pub fn with_port(url: &str, port: u16) -> String {
    let mut url = url::Url::parse(url).expect("a database URL");
    url.set_port(Some(port)).expect("a URL with a host");
    url.to_string()
}
