//! The `picomq` client commands against a real server: create, append 10,000 lines,
//! read, `tail -f` picking up a record appended after it started and exiting when the
//! stream is closed, `ls` with a prefix and pagination, close, rm, and the exit
//! codes a script relies on.

use picomq_testkit as support;

use std::time::Duration;

use support::cli::Cli;
use support::{Server, TempDir};

const LINES: usize = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_append_read_tail_close_rm() {
    let dir = TempDir::new("cli-cycle");
    let server = Server::start_process(dir.path(), &[]).await;
    let cli = Cli::new(&server.url);

    let r = cli.run(&["create", "cycle/logs", "--output", "json"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["created"], true);
    assert_eq!(r.json()["contentType"], "text/plain");
    // Creating it again with the same configuration succeeds; with another, conflicts.
    let r = cli.run(&["create", "cycle/logs", "--output", "json"]).await;
    assert_eq!(
        (r.code, r.json()["created"].clone()),
        (0, false.into()),
        "{r:?}"
    );
    let r = cli.run(&["create", "cycle/logs", "--json"]).await;
    assert_eq!(r.code, 4, "conflict exit code: {r:?}");

    let input: String = (0..LINES).map(|i| format!("line {i}\n")).collect();
    let r = cli
        .run_with_stdin(
            &["append", "cycle/logs", "--output", "json"],
            input.as_bytes(),
        )
        .await;
    assert_eq!(r.code, 0, "{r:?}");
    let report = r.json();
    assert_eq!(report["records"], LINES as u64);
    assert_eq!(report["bytes"], input.len() as u64);
    let batches = report["batches"].as_u64().unwrap();
    assert!(
        (1..=10).contains(&batches),
        "{LINES} short lines should travel in a few batches, not {batches}"
    );

    let r = cli.run(&["read", "cycle/logs"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout == input,
        "read returned {} bytes, appended {}",
        r.stdout.len(),
        input.len()
    );
    let r = cli.run(&["read", "cycle/logs", "--limit", "3"]).await;
    assert_eq!(r.stdout, "line 0\nline 1\nline 2\n");

    // tail -f: catches up on the history, then prints a record appended later.
    let mut tail = cli.spawn(&["tail", "-f", "cycle/logs"]);
    tail.wait_for_lines(LINES, Duration::from_secs(30)).await;
    let r = cli
        .run_with_stdin(&["append", "cycle/logs"], b"appended after tail started\n")
        .await;
    assert_eq!(r.code, 0, "{r:?}");
    tail.wait_for_lines(LINES + 1, Duration::from_secs(10))
        .await;
    assert_eq!(tail.lines[LINES], "appended after tail started");

    // Closing the stream ends the tail, successfully.
    let r = cli.run(&["close", "cycle/logs"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(tail.wait_exit(Duration::from_secs(10)).await, 0);
    assert_eq!(tail.lines.len(), LINES + 1, "tail printed extra lines");
    for (i, line) in tail.lines[..LINES].iter().enumerate() {
        assert_eq!(line, &format!("line {i}"));
    }

    let r = cli.run(&["head", "cycle/logs", "--output", "json"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["closed"], true);
    let r = cli
        .run_with_stdin(&["append", "cycle/logs"], b"too late\n")
        .await;
    assert_eq!(r.code, 4, "append to a closed stream is a conflict: {r:?}");
    assert!(r.stderr.contains("closed"), "{r:?}");

    let r = cli.run(&["rm", "cycle/logs"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    for args in [
        &["head", "cycle/logs"][..],
        &["read", "cycle/logs"],
        &["rm", "cycle/logs"],
        &["tail", "-f", "cycle/logs"],
    ] {
        let r = cli.run(args).await;
        assert_eq!(r.code, 3, "{args:?} on a deleted stream: {r:?}");
        assert!(r.stdout.is_empty(), "errors go to stderr: {r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_filters_by_prefix_and_pages() {
    let dir = TempDir::new("cli-ls");
    let server = Server::start(dir.path(), &[]).await;
    let cli = Cli::new(&server.url);
    let names: Vec<String> = (0..7).map(|i| format!("team/a/s{i}")).collect();
    for name in names
        .iter()
        .map(String::as_str)
        .chain(["team/b/x", "teamless", "other"])
    {
        assert_eq!(cli.run(&["create", name]).await.code, 0);
    }

    // Seven streams under the prefix, three per request: three pages, in name order.
    let r = cli
        .run(&["ls", "--prefix", "team/a/", "--page-size", "3"])
        .await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.stdout.lines().collect::<Vec<_>>(), names);
    let r = cli
        .run(&[
            "ls",
            "--prefix",
            "team/a/",
            "--page-size",
            "3",
            "--limit",
            "4",
        ])
        .await;
    assert_eq!(r.stdout.lines().collect::<Vec<_>>(), names[..4]);
    let r = cli
        .run(&["ls", "--prefix", "team/a/", "--after", "team/a/s4"])
        .await;
    assert_eq!(r.stdout.lines().collect::<Vec<_>>(), names[5..]);
    let r = cli
        .run(&[
            "ls",
            "--prefix",
            "team/",
            "--output",
            "json",
            "--page-size",
            "2",
        ])
        .await;
    let listed: Vec<String> = r
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    let mut expected = names.clone();
    expected.push("team/b/x".into());
    assert_eq!(listed, expected);
    let first = &r.json()[0];
    assert_eq!(first["contentType"], "text/plain");
    assert_eq!(first["closed"], false);
    assert!(
        first["nextOffset"].is_string() && first["createdAt"].is_string(),
        "{first}"
    );
    let r = cli
        .run(&["ls", "--prefix", "nothing/", "--output", "json"])
        .await;
    assert_eq!((r.code, r.json()), (0, serde_json::json!([])));

    // Names are URL paths: a name typed with any characters, its listing, and the
    // listed form all address the same stream.
    assert_eq!(cli.run(&["create", "intl/caf\u{e9} menu"]).await.code, 0);
    for prefix in ["intl/caf\u{e9}", "intl/caf%C3%A9", "intl/"] {
        let r = cli.run(&["ls", "--prefix", prefix]).await;
        assert_eq!(
            r.stdout, "intl/caf%C3%A9%20menu\n",
            "prefix {prefix}: {r:?}"
        );
    }
    assert_eq!(cli.run(&["head", "intl/caf%C3%A9%20menu"]).await.code, 0);

    // Deleted streams leave the listing.
    assert_eq!(cli.run(&["rm", "team/a/s3"]).await.code, 0);
    let r = cli.run(&["ls", "--prefix", "team/a/"]).await;
    assert!(!r.stdout.lines().any(|l| l == "team/a/s3"), "{r:?}");
    assert_eq!(r.stdout.lines().count(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_streams_take_one_value_per_line() {
    let dir = TempDir::new("cli-json");
    let server = Server::start(dir.path(), &[]).await;
    let cli = Cli::new(&server.url);
    assert_eq!(cli.run(&["create", "events", "--json"]).await.code, 0);
    let r = cli
        .run_with_stdin(&["append", "events"], b"{\"a\":1}\n\n[1,2]\n\"three\"\n")
        .await;
    assert_eq!(r.code, 0, "{r:?}");
    // Each line is one record, even an array (it is sent inside the batch's array).
    let r = cli.run(&["read", "events"]).await;
    assert_eq!(r.stdout, "{\"a\":1}\n[1,2]\n\"three\"\n");
    let r = cli
        .run(&["read", "events", "--limit", "2", "--output", "json"])
        .await;
    let events: Vec<serde_json::Value> = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events[0]["data"], serde_json::json!([{"a": 1}, [1, 2]]));
    assert_eq!(events.last().unwrap()["type"], "end");
    // A line that is not JSON is refused before anything is sent, naming the line.
    let r = cli
        .run_with_stdin(&["append", "events"], b"4\n{nope\n")
        .await;
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("line 2"), "{r:?}");
    assert_eq!(cli.run(&["read", "events"]).await.stdout.lines().count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_has_its_own_exit_code() {
    let cli = Cli::new(&format!("http://127.0.0.1:{}", support::free_port()));
    let r = cli.run(&["head", "anything"]).await;
    assert_eq!(r.code, 6, "{r:?}");
    assert!(r.stderr.contains("cannot reach"), "{r:?}");
    let r = cli.run(&["ls", "--output", "json"]).await;
    assert_eq!(r.code, 6);
    let err: serde_json::Value =
        serde_json::from_str(r.stderr.trim()).expect("JSON error on stderr");
    assert_eq!(err["error"]["kind"], "unavailable");
    assert_eq!(err["error"]["exitCode"], 6);
    let r = cli
        .run_with_stdin(&["append", "s", "--retry-for", "0s"], b"x\n")
        .await;
    assert_eq!(r.code, 6, "{r:?}");
}
