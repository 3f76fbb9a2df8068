//! A cluster that cannot be assembled wrong: every way of pairing a `--store` prefix
//! with the wrong `--meta` is refused at start, with both sides named, and writes
//! nothing to the wrong place; two first starts racing on one empty prefix leave one
//! winner; a member whose binding changes while it runs stops acknowledging and says
//! why; a copy of the metadata serves only after a deliberate `picomq store rebind`;
//! and a second server on a held data directory is refused at once. Real processes
//! throughout, on the S3 test server and Postgres (`PICOMQ_TEST_PG_URL`).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use picomq_engine::store::{name as store_name, ObjectPath, ObjectStoreExt};
use picomq_testkit as support;
use support::cluster::TestCluster;
use support::postgres::Database;
use support::{fresh_s3_url, start_refused, Server, TempDir};

const LEASE: &[&str] = &["--lease", "2s"];
/// A refusal needs the metadata and one or two requests to the bucket.
const REFUSED_WITHIN: Duration = Duration::from_secs(30);

/// The epoch claims under a store URL's prefix (one per member that ever started).
async fn claims(store_url: &str) -> Vec<String> {
    let mut all = support::store_keys(store_url).await;
    all.retain(|k| k.starts_with("epochs/"));
    all
}

fn member(meta: &str, store: &str, node_id: &str) -> Vec<String> {
    let mut args: Vec<String> = ["--meta", meta, "--store", store, "--node-id", node_id]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(LEASE.iter().map(|s| s.to_string()));
    args
}

fn refused(dir: &TempDir, args: &[String]) -> support::Refused {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    start_refused(dir.path(), &args, REFUSED_WITHIN)
}

async fn cluster_id(cluster: &TestCluster) -> String {
    let v = cluster.nodes_seen_by(0).await;
    v["cluster"]["clusterId"]
        .as_str()
        .expect("the nodes endpoint names the cluster")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_on_another_prefix_of_the_same_database_are_refused() {
    let cluster = TestCluster::start("idprefix", 2, LEASE).await;
    let id = cluster_id(&cluster).await;
    let typo = fresh_s3_url("idprefix-typo");
    let dir = TempDir::new("idprefix-typo");
    let r = refused(&dir, &member(&cluster.db.url, &typo, "node-9"));
    for named in [
        "refusing to start",
        &id,
        &store_name(&cluster.store),
        &store_name(&typo),
    ] {
        assert!(r.log.contains(named), "{named:?} not in:\n{}", r.log);
    }
    assert!(
        support::store_keys(&typo).await.is_empty(),
        "nothing written to the typo's prefix"
    );
    // The cluster goes on, and shows what it is bound to.
    let v = cluster.nodes_seen_by(1).await;
    assert_eq!(v["cluster"]["store"], store_name(&cluster.store));
    assert_eq!(v["cluster"]["meta"]["kind"], "postgres");
    let live = v["nodes"].as_array().unwrap().iter();
    assert_eq!(live.filter(|n| n["state"] == "live").count(), 2, "{v}");
    let ls = support::cli::Cli::new(&cluster.node(0).url)
        .run(&["node", "ls"])
        .await;
    assert_eq!(ls.code, 0, "{ls:?}");
    assert!(
        ls.stdout.contains(&format!("cluster {id}")),
        "{}",
        ls.stdout
    );
    assert!(
        ls.stdout.contains(&store_name(&cluster.store)),
        "{}",
        ls.stdout
    );
    cluster.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_database_on_a_clusters_prefix_is_refused() {
    let cluster = TestCluster::start("idtwodb", 1, LEASE).await;
    let id = cluster_id(&cluster).await;
    let other = Database::create("idtwodb_other").await;
    let before = claims(&cluster.store).await;
    let dir = TempDir::new("idtwodb-other");
    let r = refused(&dir, &member(&other.url, &cluster.store, "other-1"));
    assert!(r.log.contains("refusing to start"), "{}", r.log);
    assert!(r.log.contains(&id), "{}", r.log);
    assert!(r.log.contains("another database"), "{}", r.log);
    assert_eq!(
        claims(&cluster.store).await,
        before,
        "the refused node claimed nothing"
    );
    other.drop().await;
    cluster.shut_down().await;
}

/// `picomq serve` started without waiting for it: its process, port and log.
fn spawn_serve(dir: &TempDir, args: &[String]) -> (Child, u16, std::path::PathBuf) {
    let port = support::free_port();
    let log = dir.path().join(format!("serve-{port}.log"));
    let file = std::fs::File::create(&log).expect("log");
    let child = Command::new(support::picomq_bin())
        .arg("serve")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--data-dir")
        .arg(dir.path())
        .args(args)
        .env("PICOMQ_LOG", "info")
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("log"))
        .stderr(file)
        .spawn()
        .expect("spawn picomq");
    (child, port, log)
}

/// Whether the process became ready (`true`) or exited (`false`).
async fn ready_or_exited(child: &mut Child, port: u16) -> bool {
    let client = support::Client::new(&format!("http://127.0.0.1:{port}"));
    let deadline = Instant::now() + REFUSED_WITHIN;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return false;
        }
        if let Ok(r) = client.get("/readyz").await {
            if r.status.as_u16() == 200 {
                return true;
            }
        }
        assert!(Instant::now() < deadline, "neither ready nor refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_databases_racing_on_one_empty_prefix_leave_one_winner() {
    for round in 0..3 {
        let prefix = fresh_s3_url("idrace");
        let (db_a, db_b) = (
            Database::create("idrace_a").await,
            Database::create("idrace_b").await,
        );
        let (dir_a, dir_b) = (TempDir::new("idrace-a"), TempDir::new("idrace-b"));
        let (mut a, port_a, log_a) = spawn_serve(&dir_a, &member(&db_a.url, &prefix, "a-1"));
        let (mut b, port_b, log_b) = spawn_serve(&dir_b, &member(&db_b.url, &prefix, "b-1"));
        let (ready_a, ready_b) = tokio::join!(
            ready_or_exited(&mut a, port_a),
            ready_or_exited(&mut b, port_b)
        );
        let log = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
        assert!(
            ready_a != ready_b,
            "round {round}: exactly one must win (a ready: {ready_a}, b ready: {ready_b});\na:\n{}\nb:\n{}",
            log(&log_a),
            log(&log_b)
        );
        let loser = if ready_a { log(&log_b) } else { log(&log_a) };
        assert!(loser.contains("refusing to start"), "{loser}");
        // Every claim in the prefix is the winner's.
        let winner = if ready_a { &db_a } else { &db_b };
        let members = claims(&prefix).await.len();
        assert_eq!(members, 1, "round {round}: one member claimed an epoch");
        let _ = (a.kill(), b.kill(), a.wait(), b.wait());
        let _ = winner;
        db_a.drop().await;
        db_b.drop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_single_node_on_a_clusters_prefix_is_refused() {
    let cluster = TestCluster::start("idsingle", 1, LEASE).await;
    let before = support::store_keys(&cluster.store).await;
    let dir = TempDir::new("idsingle-node");
    let args = ["--store".to_string(), cluster.store.clone()];
    let r = refused(&dir, &args);
    assert!(
        r.log
            .contains("single node (SQLite) cannot serve a cluster's prefix"),
        "{}",
        r.log
    );
    assert!(r.log.contains(&store_name(&cluster.store)), "{}", r.log);
    let after = support::store_keys(&cluster.store).await;
    let new: Vec<&String> = after.iter().filter(|k| !before.contains(k)).collect();
    assert!(
        new.iter()
            .all(|k| !k.starts_with("epochs/") && !k.starts_with("checkpoints/")),
        "{new:?}"
    );
    cluster.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_on_a_single_nodes_prefix_is_refused() {
    let prefix = fresh_s3_url("idcluster-on-single");
    let single_dir = TempDir::new("idcluster-single");
    let single = Server::start_process(single_dir.path(), &["--store", &prefix]).await;
    let r = single
        .client
        .put("/s/one", &[("content-type", "text/plain")], "hello")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    let before = claims(&prefix).await;
    let db = Database::create("idcluster_on_single").await;
    let dir = TempDir::new("idcluster-member");
    let r = refused(&dir, &member(&db.url, &prefix, "m-1"));
    assert!(r.log.contains("written by a single node"), "{}", r.log);
    assert!(r.log.contains(&store_name(&prefix)), "{}", r.log);
    assert_eq!(
        claims(&prefix).await,
        before,
        "the refused member claimed nothing"
    );
    let read = single.client.get("/s/one?offset=-1").await.unwrap();
    assert_eq!(read.text(), "hello");
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_whose_prefix_changes_hands_stops_acknowledging() {
    let mut cluster = TestCluster::start("idwatch", 1, LEASE).await;
    let r = cluster
        .node(0)
        .client
        .put("/w/one", &[("content-type", "text/plain")], "a")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    // Someone replaces the prefix's identity (another cluster's, copied over).
    let store = picomq_engine::store::open(&cluster.store).unwrap();
    let other = r#"{"clusterId":"someone-else","metaKind":"postgres","metaId":"x.1","store":"s3://elsewhere","createdUnixMs":0}"#;
    store
        .put(
            &ObjectPath::from("identity.json"),
            other.as_bytes().to_vec().into(),
        )
        .await
        .unwrap();
    let status = cluster.node_mut(0).wait_exit(Duration::from_secs(20));
    assert!(!status.success());
    let log = cluster.node(0).log_text();
    assert!(log.contains("no longer belong to each other"), "{log}");
    assert!(log.contains("someone-else"), "{log}");
    cluster.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_of_the_metadata_serves_only_after_a_rebind() {
    let mut cluster = TestCluster::start("idcopy", 1, LEASE).await;
    let r = cluster
        .node(0)
        .client
        .put("/c/one", &[("content-type", "text/plain")], "kept")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 201, "{}", r.text());
    cluster.node_mut(0).stop().await;
    // A restore from a backup onto a new database.
    let copy = cluster.db.copy("idcopy_restored").await;
    let dir = TempDir::new("idcopy-restored");
    let args = member(&copy.url, &cluster.store, "node-1");
    let r = refused(&dir, &args);
    assert!(
        r.log.contains("another database, or a copy of it"),
        "{}",
        r.log
    );
    let cli = support::cli::Cli::new("http://127.0.0.1:1");
    let rebind = [
        "store",
        "rebind",
        "--store",
        &cluster.store,
        "--meta",
        &copy.url,
    ];
    let dry = cli.run(&rebind).await;
    assert_eq!(dry.code, 0, "{dry:?}");
    assert!(dry.stdout.contains("--yes"), "{dry:?}");
    let mut yes = rebind.to_vec();
    yes.push("--yes");
    let done = cli.run(&yes).await;
    assert_eq!(done.code, 0, "{done:?}");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let restored = Server::start_process(dir.path(), &args).await;
    let read = support::eventually(Duration::from_secs(20), || async {
        let r = restored.client.get("/c/one?offset=-1").await.ok()?;
        (r.status.as_u16() == 200).then(|| r.text())
    })
    .await;
    assert_eq!(read, "kept");
    // The database it was copied from is now the one refused.
    let old_dir = TempDir::new("idcopy-old");
    let r = refused(&old_dir, &member(&cluster.db.url, &cluster.store, "node-2"));
    assert!(r.log.contains("refusing to start"), "{}", r.log);
    drop(restored);
    copy.drop().await;
    cluster.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_server_on_a_held_data_directory_is_refused_at_once() {
    let dir = TempDir::new("idlock");
    let first = Server::start_process(dir.path(), &[]).await;
    let r = start_refused(dir.path(), &[], Duration::from_secs(10));
    assert!(r.elapsed < Duration::from_secs(1), "took {:?}", r.elapsed);
    assert!(
        r.log.contains(&dir.path().display().to_string()),
        "{}",
        r.log
    );
    assert!(r.log.contains(&format!("pid {}", first.pid())), "{}", r.log);
    // The first one serves on.
    let ok = first.client.get("/readyz").await.unwrap();
    assert_eq!(ok.status.as_u16(), 200);
}
