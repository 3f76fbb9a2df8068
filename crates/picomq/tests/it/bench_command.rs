//! `picomq bench` against a real server: a short run acknowledges records, its live
//! readers see them, catch-up reads them back, and the JSON report carries the
//! figures the comparison tables read. No timing is asserted.

use picomq_testkit as support;

use std::process::Command;

use support::{Server, TempDir};

fn bench(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_picomq"))
        .arg("bench")
        .args(args)
        .args(["--output", "json", "--quiet"])
        .output()
        .expect("run picomq bench");
    assert!(
        out.status.success(),
        "picomq bench failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "report is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_append_run_reports_acked_records_and_costs() {
    let dir = TempDir::new("bench-append");
    let server = Server::start_process(dir.path(), &[]).await;
    let pid = server.pid().to_string();
    let url = format!("{}/v1/stream", server.url);
    let report = bench(&[
        &url,
        "--duration",
        "2s",
        "--warmup",
        "500ms",
        "--streams",
        "3",
        "--in-flight",
        "8",
        "--record-bytes",
        "100",
        "--batch",
        "4",
        "--live",
        "sse",
        "--catch-up",
        "10s",
        "--server-pid",
        &pid,
        "--stream-prefix",
        "t",
        "--label",
        "picomq",
    ]);
    assert_eq!(report["label"], "picomq");
    let append = &report["append"];
    let records = append["records"].as_u64().unwrap();
    assert!(records > 0, "no records acknowledged: {report:#}");
    assert_eq!(records % 4, 0, "records come in requests of 4");
    assert_eq!(append["errors"], 0, "{report:#}");
    let ack = &append["ack_latency_ms"];
    assert!(ack["count"].as_u64().unwrap() > 0);
    assert!(ack["p50"].as_f64().unwrap() <= ack["p99"].as_f64().unwrap());
    assert!(ack["p99"].as_f64().unwrap() <= ack["max"].as_f64().unwrap());

    let e2e = &report["end_to_end"];
    assert_eq!(e2e["mode"], "sse");
    assert!(
        e2e["latency_ms"]["count"].as_u64().unwrap() > 0,
        "{report:#}"
    );

    // Catch-up read every record written, warm-up included, and nothing else.
    let catch_up = &report["catch_up"];
    assert_eq!(catch_up["complete"], true, "{report:#}");
    let mut on_server = 0;
    for i in 0..3 {
        on_server += json_messages(&server.client, &format!("/v1/stream/t-{i}")).await;
    }
    assert_eq!(catch_up["records"].as_u64().unwrap(), on_server);
    assert!(on_server >= records);

    let s = &report["server"];
    assert_eq!(s["has_metrics"], true);
    assert!(s["store_puts"].as_f64().unwrap() >= 1.0, "{report:#}");
    assert!(s["store_puts_per_1000_records"].as_f64().unwrap() > 0.0);
    assert!(s["cpu_s"].as_f64().is_some());
    assert!(s["vm_hwm_mb"].as_f64().unwrap() > 0.0);

    // The machine's idle and steal over the window: shares, and a busy bench leaves
    // less than all of it idle.
    let m = &report["machine"];
    let idle = m["cpu_idle_share"].as_f64().unwrap();
    let steal = m["cpu_steal_share"].as_f64().unwrap();
    assert!((0.0..1.0).contains(&idle), "{report:#}");
    assert!(
        (0.0..=1.0).contains(&steal) && idle + steal <= 1.0,
        "{report:#}"
    );
}

/// Under --rate the acknowledgement latency is split into the client's send lag and
/// the time from the send: per request the two add up, so their means do too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_loop_run_splits_the_ack_into_send_lag_and_from_send() {
    let dir = TempDir::new("bench-rate");
    let server = Server::start(dir.path(), &[]).await;
    let url = format!("{}/v1/stream", server.url);
    let trace = dir.path().join("requests.trace");
    let report = bench(&[
        &url,
        "--duration",
        "2s",
        "--warmup",
        "300ms",
        "--streams",
        "2",
        "--in-flight",
        "4",
        "--rate",
        "200",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    let append = &report["append"];
    assert_eq!(append["errors"], 0, "{report:#}");
    let (ack, lag, sent) = (
        &append["ack_latency_ms"],
        &append["send_lag_ms"],
        &append["from_send_ms"],
    );
    let count = ack["count"].as_u64().unwrap();
    assert!(count > 100, "{report:#}");
    assert_eq!(lag["count"].as_u64(), Some(count), "{report:#}");
    assert_eq!(sent["count"].as_u64(), Some(count), "{report:#}");
    let mean = |l: &serde_json::Value| l["mean"].as_f64().unwrap();
    let parts = mean(lag) + mean(sent);
    assert!(
        (mean(ack) - parts).abs() <= 0.01 * mean(ack) + 0.01,
        "ack mean {} vs send lag + from send {parts}: {report:#}",
        mean(ack)
    );
    assert!(sent["max"].as_f64() <= ack["max"].as_f64());

    // --trace: a line per request, in the order they were due; those due inside the
    // window are the ones the histogram counted.
    let text = std::fs::read_to_string(&trace).unwrap();
    let window_from: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("# window_us "))
        .and_then(|w| w.split(' ').next()?.parse().ok())
        .expect("window line");
    assert!(
        text.contains("# clock_monotonic_us_at_zero "),
        "{text:.300}"
    );
    let rows: Vec<[u64; 4]> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let v: Vec<u64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
            [v[0], v[1], v[2], v[3]]
        })
        .collect();
    assert!(rows.windows(2).all(|w| w[0][0] <= w[1][0]), "sorted by due");
    assert!(
        rows.iter().all(|r| r[1] <= r[2] && r[3] == 204),
        "each sent, then acknowledged"
    );
    let in_window = rows.iter().filter(|r| r[0] >= window_from).count() as u64;
    assert_eq!(in_window, count, "{report:#}");
    // The histogram keeps three significant digits.
    let slowest_ms = rows
        .iter()
        .filter(|r| r[0] >= window_from)
        .map(|r| (r[2] - r[0]) as f64 / 1000.0)
        .fold(0.0, f64::max);
    let max_ms = ack["max"].as_f64().unwrap();
    assert!(
        (slowest_ms - max_ms).abs() <= 0.002 * max_ms + 0.002,
        "slowest traced {slowest_ms} ms vs histogram max {max_ms}: {report:#}"
    );

    // Closed loop: nothing is due before it is sent, so there is no split.
    let closed = bench(&[
        &url,
        "--duration",
        "1s",
        "--warmup",
        "200ms",
        "--streams",
        "2",
    ]);
    assert!(closed["append"].get("send_lag_ms").is_none(), "{closed:#}");
}

/// --http2 multiplexes the writers over a few h2c connections (the lane speaks only
/// HTTP/2, so a run that acknowledges anything spoke it) and every record arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_run_multiplexes_writers_and_loses_nothing() {
    let dir = TempDir::new("bench-h2");
    let server = Server::start(dir.path(), &[]).await;
    let url = format!("{}/v1/stream", server.url);
    let report = bench(&[
        &url,
        "--http2",
        "--connections",
        "2",
        "--duration",
        "1s",
        "--warmup",
        "200ms",
        "--streams",
        "3",
        "--in-flight",
        "16",
        "--record-bytes",
        "200",
        "--catch-up",
        "10s",
        "--stream-prefix",
        "h",
    ]);
    assert_eq!(report["workload"]["http"], "2");
    assert_eq!(report["workload"]["connections"], 2);
    let append = &report["append"];
    assert!(append["records"].as_u64().unwrap() > 0, "{report:#}");
    assert_eq!(append["errors"], 0, "{report:#}");
    let catch_up = &report["catch_up"];
    assert_eq!(catch_up["complete"], true, "{report:#}");
    let mut on_server = 0;
    for i in 0..3 {
        on_server += json_messages(&server.client, &format!("/v1/stream/h-{i}")).await;
    }
    assert_eq!(catch_up["records"].as_u64().unwrap(), on_server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_create_workload_creates_every_stream_and_probes_some() {
    let dir = TempDir::new("bench-create");
    let server = Server::start(dir.path(), &[]).await;
    let url = format!("{}/v1/stream", server.url);
    let report = bench(&[
        &url,
        "--workload",
        "create",
        "--streams",
        "200",
        "--in-flight",
        "16",
        "--record-bytes",
        "64",
        "--sample",
        "20",
        "--stream-prefix",
        "many",
    ]);
    let create = &report["create"];
    assert_eq!(create["streams"], 200, "{report:#}");
    assert_eq!(create["errors"], 0, "{report:#}");
    assert_eq!(create["probe_append_ms"]["count"], 10);
    assert_eq!(create["probe_read_ms"]["count"], 10);
    assert!(json_messages(&server.client, "/v1/stream/many-199").await > 0);
}

/// Messages in a JSON stream, read page by page (each page is its own JSON array).
async fn json_messages(client: &support::Client, path: &str) -> u64 {
    let mut n = 0;
    let mut offset = "-1".to_string();
    loop {
        let r = client
            .get(&format!("{path}?offset={offset}"))
            .await
            .expect("read");
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
        let page: serde_json::Value =
            serde_json::from_slice(&r.body).expect("a JSON array per page");
        n += page.as_array().expect("array").len() as u64;
        if r.header("stream-up-to-date") == Some("true") {
            return n;
        }
        offset = r
            .header("stream-next-offset")
            .expect("next offset")
            .to_string();
    }
}

#[test]
fn compare_prints_a_ratio_for_each_figure() {
    let dir = TempDir::new("bench-compare");
    let a = dir.path().join("a.json");
    let b = dir.path().join("b.json");
    let report = |label: &str, rate: f64| {
        serde_json::json!({"label": label, "append": {"records_per_s": rate,
            "ack_latency_ms": {"count": 1, "p50": 2.0, "p99": 3.0}}})
        .to_string()
    };
    std::fs::write(&a, report("picomq", 3000.0)).unwrap();
    std::fs::write(&b, report("peer", 1000.0)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_picomq"))
        .args(["bench", "compare"])
        .arg(&a)
        .arg(&b)
        .output()
        .unwrap();
    assert!(out.status.success());
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("picomq / peer"), "{table}");
    assert!(table.contains("3.00x"), "{table}");
    assert!(table.contains("1.00x"), "{table}");
}

/// `bench native` on a tiny configuration: every part runs, both paths acknowledge
/// appends, both catch-up reads read every record, and every read by time finds the
/// record the fill's acknowledgements say it must.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_benchmark_runs_every_part_and_finds_every_record() {
    let dir = TempDir::new("bench-native");
    let server = Server::start_process(dir.path(), &[]).await;
    let pid = server.pid().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_picomq"))
        .args([
            "bench",
            "native",
            "--url",
            &server.url,
            "--server-pid",
            &pid,
        ])
        .args(["--writers", "2", "--record-bytes", "100", "--batch", "1,10"])
        .args(["--duration", "300ms", "--warmup", "100ms"])
        .args(["--read-records", "3000", "--read-count", "100"])
        .args([
            "--seek-records",
            "5000",
            "--fill-writers",
            "2",
            "--fill-batch",
            "100",
        ])
        .args(["--seeks", "20"])
        .output()
        .expect("run picomq bench native");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "picomq bench native failed ({}):\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for case in [
        "100 B x    1 native",
        "100 B x    1 ds",
        "100 B x   10 native",
    ] {
        let line = text.lines().find(|l| l.contains(case)).unwrap_or_else(|| {
            panic!("no line for {case}:\n{text}");
        });
        assert!(line.contains(" 0 errors"), "{line}");
    }
    assert!(text.contains("(30 requests, 100 records each"), "{text}");
    for kind in ["native count=1 ", "native count=1 bytes=1", "ds timestamp"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(kind))
            .unwrap_or_else(|| {
                panic!("no line for {kind}:\n{text}");
            });
        assert!(line.contains("; 0 mismatches of 20"), "{line}");
    }
    assert!(text.trim_end().ends_with("result: ok"), "{text}");
}
