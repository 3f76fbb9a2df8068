//! A cluster for tests: nodes as `picomq serve` processes on one Postgres database
//! of the test's own and one prefix of the S3 test server, and HAProxy in front
//! (`.ci/haproxy.sh`, round robin with health checks). Nodes can be killed,
//! paused (SIGSTOP), resumed and restarted on their own port and data directory.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use picomq_client::Client;
use serde_json::Value;

use crate::postgres::Database;
use crate::{free_port, fresh_s3_url, Server, TempDir};

pub struct TestCluster {
    pub db: Database,
    /// What the nodes get as `--meta`: the database's URL, or a way to it.
    meta_url: String,
    pub store: String,
    pub nodes: Vec<Server>,
    /// Flags every node gets besides the cluster's own.
    extra: Vec<String>,
    dirs: Vec<TempDir>,
    haproxy: Option<Haproxy>,
}

pub struct Haproxy {
    dir: TempDir,
    pub url: String,
    pub client: Client,
}

impl TestCluster {
    /// `n` nodes (`node-1` ...) on a fresh database and bucket prefix, each with
    /// `extra` flags, all ready.
    pub async fn start(tag: &str, n: usize, extra: &[&str]) -> TestCluster {
        TestCluster::start_reaching_db(tag, n, extra, |url| url.to_string()).await
    }

    /// `start`, the nodes reaching the database at the URL `reach` makes of its own
    /// (e.g. through a relay that can cut them off, `tcp_cut`).
    pub async fn start_reaching_db(
        tag: &str,
        n: usize,
        extra: &[&str],
        reach: impl Fn(&str) -> String,
    ) -> TestCluster {
        let db = Database::create(tag).await;
        let meta_url = reach(&db.url);
        TestCluster::start_with(db, meta_url, fresh_s3_url(tag), n, extra).await
    }

    /// `n` nodes on `db` and the prefix `store` as they already are (a cluster
    /// assembled by a move into the database), each with `extra` flags, all ready.
    pub async fn start_on(db: Database, store: &str, n: usize, extra: &[&str]) -> TestCluster {
        let meta_url = db.url.clone();
        TestCluster::start_with(db, meta_url, store.to_string(), n, extra).await
    }

    async fn start_with(
        db: Database,
        meta_url: String,
        store: String,
        n: usize,
        extra: &[&str],
    ) -> TestCluster {
        let mut cluster = TestCluster {
            meta_url,
            db,
            store,
            nodes: Vec::new(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            dirs: Vec::new(),
            haproxy: None,
        };
        for _ in 0..n {
            cluster.add_node().await;
        }
        cluster
    }

    /// Starts one more node (it joins and takes its share).
    pub async fn add_node(&mut self) -> usize {
        self.add_node_with_env(&[]).await
    }

    /// [`TestCluster::add_node`] with extra environment variables for that node.
    pub async fn add_node_with_env(&mut self, env: &[(&str, &str)]) -> usize {
        let i = self.nodes.len();
        let dir = TempDir::new(&format!("cluster-node-{}", i + 1));
        let node_id = format!("node-{}", i + 1);
        let mut args = vec![
            "--meta".to_string(),
            self.meta_url.clone(),
            "--store".to_string(),
            self.store.clone(),
            "--node-id".to_string(),
            node_id,
        ];
        args.extend(self.extra.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = Server::start_process_env(dir.path(), &args, env).await;
        self.dirs.push(dir);
        self.nodes.push(server);
        i
    }

    pub fn node(&self, i: usize) -> &Server {
        &self.nodes[i]
    }

    pub fn node_mut(&mut self, i: usize) -> &mut Server {
        &mut self.nodes[i]
    }

    pub fn node_id(i: usize) -> String {
        format!("node-{}", i + 1)
    }

    /// `kill -9` node `i`.
    pub fn kill9(&mut self, i: usize) {
        self.nodes[i].kill9();
    }

    /// Starts node `i` again (same port, node id and data directory; after a kill).
    pub async fn restart(&mut self, i: usize) {
        self.nodes[i].restart().await;
    }

    /// SIGSTOP (`pause`) or SIGCONT (`resume`) to node `i`.
    pub fn signal(&self, i: usize, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.nodes[i].pid().to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// HAProxy round robin over every node; its URL.
    pub async fn start_haproxy(&mut self) -> String {
        let dir = TempDir::new("haproxy");
        let port = free_port();
        let script = repo_root().join(".ci/haproxy.sh");
        let backends: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let status = Command::new("bash")
            .arg(&script)
            .arg("start")
            .arg(dir.path())
            .arg(port.to_string())
            .args(&backends)
            .status()
            .expect("run .ci/haproxy.sh");
        assert!(status.success(), ".ci/haproxy.sh start failed");
        let url = format!("http://127.0.0.1:{port}");
        self.haproxy = Some(Haproxy {
            dir,
            client: Client::new(&url),
            url: url.clone(),
        });
        url
    }

    pub fn haproxy(&self) -> &Haproxy {
        self.haproxy.as_ref().expect("start_haproxy first")
    }

    /// `GET /__picomq/nodes` from node `i`.
    pub async fn nodes_seen_by(&self, i: usize) -> Value {
        let r = self.nodes[i]
            .client
            .get("/__picomq/nodes")
            .await
            .expect("GET /__picomq/nodes");
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
        serde_json::from_slice(&r.body).expect("nodes JSON")
    }

    /// Waits until every running node is live with at least three quarters of a
    /// fair share of the slots, as node `via` sees them, the slots add up, and the
    /// shares held still for a second (no hand-over under way).
    pub async fn wait_balanced(&self, via: usize, running: usize, limit: Duration) {
        let deadline = std::time::Instant::now() + limit;
        let mut last: Option<Vec<(String, u64)>> = None;
        loop {
            let v = self.nodes_seen_by(via).await;
            let mut shares: Vec<(String, u64)> = v["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|n| n["state"] == "live" && n["slots"].as_u64() > Some(0))
                .map(|n| {
                    let id = n["nodeId"].as_str().unwrap_or("?").to_string();
                    (id, n["slots"].as_u64().unwrap_or(0))
                })
                .collect();
            shares.sort();
            let total: u64 = shares.iter().map(|(_, n)| n).sum();
            let fair = 1024 / running.max(1) as u64;
            let even = shares.len() == running
                && total == 1024
                && shares.iter().all(|(_, n)| *n * 4 >= fair * 3);
            if even && last.as_ref() == Some(&shares) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the cluster did not balance within {limit:?}: {v}"
            );
            let pause = if even { 1000 } else { 100 };
            last = even.then_some(shares);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    /// Stops HAProxy and every node, then drops the database.
    pub async fn shut_down(mut self) {
        self.haproxy = None;
        self.nodes.clear();
        self.db.drop().await;
    }
}

/// HAProxy stops with its handle, also when a test fails and unwinds.
impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo_root().join(".ci/haproxy.sh"))
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }
}

/// The repository's root (two levels above this crate).
fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(|p| p.parent())
        .expect("repository root")
        .to_path_buf()
}
