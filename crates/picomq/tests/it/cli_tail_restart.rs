//! `picomq tail -f` keeps following across server restarts (SIGKILL and SIGTERM),
//! resuming from the last offset it printed: every record exactly once, in order.
//! `picomq append` rides out the same restarts without writing a batch twice.

use picomq_testkit as support;

use std::process::Stdio;
use std::time::Duration;

use support::cli::Cli;
use support::{Server, TempDir};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_follow_survives_restarts_without_loss_or_repeats() {
    let dir = TempDir::new("cli-tail-restart");
    let mut server = Server::start_process(dir.path(), &[]).await;
    let cli = Cli::new(&server.url);
    assert_eq!(cli.run(&["create", "live"]).await.code, 0);

    let mut long_poll = cli.spawn(&["tail", "-f", "live"]);
    let mut sse = cli.spawn(&["tail", "-f", "--sse", "live"]);
    // One append process for the whole test: it must ride out the restarts too.
    let mut append = cli
        .command(&["append", "live", "--output", "json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn append");
    let mut input = append.stdin.take().expect("stdin");
    let mut append_err = BufReader::new(append.stderr.take().expect("stderr")).lines();

    let mut expected: Vec<String> = Vec::new();
    for round in 0..4 {
        let lines: Vec<String> = (0..50)
            .map(|i| format!("[round {round}] record {i}"))
            .collect();
        input
            .write_all(
                lines
                    .iter()
                    .map(|l| format!("{l}\n"))
                    .collect::<String>()
                    .as_bytes(),
            )
            .await
            .unwrap();
        input.flush().await.unwrap();
        expected.extend(lines);
        // Both followers have everything so far: the records are durable and read.
        for tail in [&mut long_poll, &mut sse] {
            if let Err(e) = tail
                .try_wait_for_lines(expected.len(), Duration::from_secs(30))
                .await
            {
                let log = server.log_text();
                let mut from = log.len().saturating_sub(8000);
                while !log.is_char_boundary(from) {
                    from += 1;
                }
                let tail = &log[from..];
                panic!("round {round}: {e}\nend of the server log:\n{tail}");
            }
        }
        match round {
            0 => server.restart().await, // SIGKILL
            1 => {
                assert!(server.terminate(Duration::from_secs(20)).success());
                server.restart().await;
            }
            2 => {
                // Down while a batch is on its way: the append retries until it is back.
                server.kill9();
                input
                    .write_all(b"written while the server was down\n")
                    .await
                    .unwrap();
                input.flush().await.unwrap();
                expected.push("written while the server was down".into());
                let retrying = tokio::time::timeout(Duration::from_secs(20), async {
                    while let Some(line) = append_err.next_line().await.unwrap() {
                        if line.contains("retrying") {
                            return;
                        }
                    }
                    panic!("append exited while the server was down");
                });
                retrying.await.expect("append reports that it is retrying");
                server.restart().await;
            }
            _ => {}
        }
    }
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(60), append.wait_with_output())
        .await
        .expect("append finishes")
        .unwrap();
    let mut err = String::new();
    while let Ok(Some(line)) = append_err.next_line().await {
        err.push_str(&line);
    }
    assert!(out.status.success(), "append: {err}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["records"], expected.len() as u64);

    assert_eq!(cli.run(&["close", "live"]).await.code, 0);
    for (name, tail) in [("long-poll", &mut long_poll), ("sse", &mut sse)] {
        assert_eq!(
            tail.wait_exit(Duration::from_secs(30)).await,
            0,
            "{name} tail exit"
        );
        assert_eq!(tail.lines, expected, "{name} tail output");
    }
    let r = cli.run(&["read", "live"]).await;
    assert_eq!(
        r.stdout.lines().collect::<Vec<_>>(),
        expected,
        "stream content"
    );
}
