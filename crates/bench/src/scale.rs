//! The create workload (`--workload create`): many streams with one small append
//! each, as fast as --in-flight allows; then server memory right after and after an
//! idle wait (past the server's dormancy timeout), and the latency of appends and
//! reads on a random sample of the now-idle streams, one request at a time.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use hyper::header::HeaderValue;
use hyper::Method;
use tokio::sync::Mutex;

use crate::config::Workload;
use crate::conn::{Conn, Target};
use crate::driver::{for_each_concurrent, Window};
use crate::payload::{now_us, BodyTemplate};
use crate::progress::Progress;
use crate::report::{mb, CreateReport, Latency, Report};
use crate::server_metrics::{Scraper, ACTIVE_STREAMS};
use crate::stats::{histogram, Stats};
use crate::{proc, BenchError};

pub async fn run_create(w: Workload, report: &mut Report) -> Result<(), BenchError> {
    let target = Target {
        addr: w.addr,
        authority: w.authority.clone(),
        http2: w.http2,
    };
    let ct = HeaderValue::from_str(&w.content_type)
        .map_err(|_| BenchError::Config("--content-type is not a valid header".into()))?;
    let scraper = w.metrics_url.as_deref().map(Scraper::new).transpose()?;
    let template = Arc::new(BodyTemplate::new(w.record_bytes, 1, w.json));
    let stats = Arc::new(Stats::default());
    let window = Arc::new(Window::default());
    let started = now_us();
    // Every create counts: the progress line shows "measure" from the start.
    window.set(started, u64::MAX);
    let progress = Progress::start(&w, stats.clone(), window.clone(), started);
    let conns: Arc<Vec<Mutex<Conn>>> = Arc::new(
        (0..w.in_flight)
            .map(|_| Mutex::new(target.conn()))
            .collect(),
    );
    let server_before = w.server_pid.and_then(proc::sample);
    let client_before = proc::sample_self();
    {
        let (stats, conns, ct, w2) = (stats.clone(), conns.clone(), ct.clone(), w.clone());
        let with_body = w.create_with_body;
        let template = template.clone();
        for_each_concurrent(w.streams, w.in_flight, move |task, i| {
            let (stats, conns, ct, template) =
                (stats.clone(), conns.clone(), ct.clone(), template.clone());
            let path = w2.stream_path(i);
            async move {
                let mut conn = conns[task].lock().await;
                let t0 = now_us();
                let body = template.render(t0);
                match create_one(&mut conn, &path, &ct, body, with_body).await {
                    Ok(()) => {
                        stats.ack.record(task, now_us() - t0);
                        stats.acked_records.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(kind) => stats.errors.add(&kind),
                }
            }
        })
        .await;
    }
    let secs = (now_us() - started) as f64 / 1e6;
    let created = stats.acked_records.load(Ordering::Relaxed);
    if let (Some(b), Some(a)) = (server_before, w.server_pid.and_then(proc::sample)) {
        report.server.cpu_s = Some(a.cpu_secs - b.cpu_secs);
        if created > 0 {
            report.server.cpu_s_per_million_records =
                Some((a.cpu_secs - b.cpu_secs) * 1e6 / created as f64);
        }
    }
    if let (Some(b), Some(a)) = (client_before, proc::sample_self()) {
        report.client.cpu_s = Some(a.cpu_secs - b.cpu_secs);
        report.client.cpu_cores_busy = Some((a.cpu_secs - b.cpu_secs) / secs.max(1e-9));
    }
    let mut c = CreateReport {
        streams: created,
        secs,
        streams_per_s: created as f64 / secs.max(1e-9),
        errors: stats.errors.total(),
        error_kinds: stats.errors.kinds(),
        requests_per_stream: if w.create_with_body { 1 } else { 2 },
        create_latency_ms: Latency::from_us(&stats.ack.merged()),
        ..CreateReport::default()
    };
    let active = || async {
        match &scraper {
            Some(s) => s.scrape().await.and_then(|m| m.sum(ACTIVE_STREAMS, &[])),
            None => None,
        }
    };
    c.rss_mb_after_create = w.server_pid.and_then(proc::sample).map(|s| mb(s.rss_bytes));
    c.active_streams_after_create = active().await;
    if let Some(wait) = w.idle_wait {
        if w.progress {
            eprintln!("created {created} streams in {secs:.1}s; idle for {wait:?} before probing");
        }
        tokio::time::sleep(wait).await;
        c.idle_wait_s = Some(wait.as_secs_f64());
        c.rss_mb_after_idle = w.server_pid.and_then(proc::sample).map(|s| mb(s.rss_bytes));
        c.active_streams_after_idle = active().await;
    }
    let peak = progress.stop().await;
    report.server.rss_mb_peak_sampled = peak.map(mb);
    if let Some(s) = w.server_pid.and_then(proc::sample) {
        report.server.vm_hwm_mb = Some(mb(s.rss_peak_bytes));
        report.server.rss_mb_end = Some(mb(s.rss_bytes));
    }

    // Probes: distinct random streams, half appended to, half read, one at a time.
    let n = w.sample.min(created as usize);
    let mut picked = HashSet::with_capacity(n);
    while picked.len() < n {
        picked.insert(fastrand::usize(..w.streams));
    }
    let mut conn = target.conn();
    let (mut appends, mut reads) = (histogram(), histogram());
    for (j, i) in picked.into_iter().enumerate() {
        let path = w.stream_path(i);
        let t0 = now_us();
        let ok = if j % 2 == 0 {
            conn.send(Method::POST, &path, Some(&ct), &[], template.render(t0))
                .await
                .is_ok_and(|a| a.status.is_success())
        } else {
            conn.get(&format!("{path}?offset=-1"))
                .await
                .is_ok_and(|a| a.status.is_success())
        };
        let us = (now_us() - t0).max(1);
        match (ok, j % 2 == 0) {
            (true, true) => appends.saturating_record(us),
            (true, false) => reads.saturating_record(us),
            (false, _) => c.errors += 1,
        }
    }
    c.probe_append_ms = Latency::from_us(&appends);
    c.probe_read_ms = Latency::from_us(&reads);
    report.create = Some(c);
    Ok(())
}

/// PUT then one POST, or (`with_body`) one PUT carrying the record as the stream's
/// initial data; `Err` names what failed.
async fn create_one(
    conn: &mut Conn,
    path: &str,
    ct: &HeaderValue,
    body: Bytes,
    with_body: bool,
) -> Result<(), String> {
    let (initial, append) = if with_body {
        (body, None)
    } else {
        (Bytes::new(), Some(body))
    };
    let put = conn
        .send(Method::PUT, path, Some(ct), &[], initial)
        .await
        .map_err(|e| format!("create: {e}"))?;
    if !put.status.is_success() {
        return Err(format!("create: status {}", put.status.as_u16()));
    }
    let Some(body) = append else {
        return Ok(());
    };
    let post = conn
        .send(Method::POST, path, Some(ct), &[], body)
        .await
        .map_err(|e| format!("append: {e}"))?;
    if !post.status.is_success() {
        return Err(format!("append: status {}", post.status.as_u16()));
    }
    Ok(())
}
