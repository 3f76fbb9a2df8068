//! `picomq bench`: a load generator for any Durable Streams server, and the tables
//! that put its reports side by side.
//!
//! - [`config`]: flags and the checked [`config::Workload`];
//! - [`payload`]: record bodies carrying send timestamps, and finding them again;
//! - [`conn`]: one hyper connection per handle (HTTP/1.1 or h2c);
//! - [`h1`]: the writers' lean HTTP/1.1 connection;
//! - [`driver`]: the append workload (writers, live readers, catch-up reads);
//! - [`live`]: SSE and long-poll readers for end-to-end latency;
//! - [`scale`]: the create-many-streams workload;
//! - [`consumers`]: consumer groups and webhooks (`bench groups`, `bench webhooks`);
//! - [`native`]: the native record API against the Durable Streams path (`bench native`);
//! - [`stats`], [`progress`]: recording and the progress line;
//! - [`server_metrics`], [`proc`]: what the server says (/metrics) and costs (/proc);
//! - [`report`]: the report, as text or JSON, and the comparison tables.

pub mod config;
pub mod conn;
pub mod consumers;
pub mod driver;
pub mod h1;
pub mod h2c;
pub mod live;
pub mod native;
pub mod pacer;
pub mod payload;
pub mod proc;
pub mod progress;
pub mod report;
pub mod resp;
pub mod scale;
pub mod server_metrics;
pub mod stats;

use std::process::ExitCode;

pub use config::BenchArgs;
use config::{Kind, Output, TableCommand, Workload};
use report::Report;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Config(String),
    #[error("cannot connect to {0}")]
    Connect(String),
    #[error("request failed: {0}")]
    Request(String),
    #[error("setup failed: {0}")]
    Setup(String),
    #[error("{0}")]
    Report(String),
}

/// Runs the benchmark (or prints a table) as the `picomq bench` command.
pub async fn run(args: BenchArgs) -> ExitCode {
    let result = match args.table {
        Some(TableCommand::Groups(a)) => consumers::run_groups(a).await.map(|()| true),
        Some(TableCommand::Webhooks(a)) => consumers::run_webhooks(a).await.map(|()| true),
        Some(TableCommand::Native(a)) => native::run_native(a).await,
        Some(table) => print_table(table),
        None => match Workload::from_args(&args.run) {
            Ok(w) => run_workload(w)
                .await
                .map(|r| print_report(&r, args.run.output)),
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("picomq bench: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs one workload against its server and returns what it found.
// A client's report is stamped with the real time of its run.
#[allow(clippy::disallowed_methods)]
pub async fn run_workload(w: Workload) -> Result<Report, BenchError> {
    let mut report = Report {
        label: w.label.clone(),
        tool: format!("picomq-bench {}", env!("CARGO_PKG_VERSION")),
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        target: report::TargetInfo {
            url: format!("{}{}", w.origin, w.base_path),
            http: if w.http2 { "2" } else { "1.1" }.into(),
            server_header: None,
        },
        workload: report::WorkloadInfo::of(&w),
        ..Report::default()
    };
    report.machine.cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    report.machine.load_1m_before = proc::load_average();
    match w.kind {
        Kind::Append => driver::run_append(w, &mut report).await?,
        Kind::Create => scale::run_create(w, &mut report).await?,
    }
    report.machine.load_1m_after = proc::load_average();
    Ok(report)
}

/// Prints; `false` when nothing succeeded (so scripts notice).
fn print_report(r: &Report, output: Output) -> bool {
    match output {
        Output::Text => print!("{}", r.to_text()),
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(r).expect("reports serialize")
        ),
    }
    let appended = r.append.as_ref().is_some_and(|a| a.records > 0);
    let created = r.create.as_ref().is_some_and(|c| c.streams > 0);
    appended || created
}

fn print_table(table: TableCommand) -> Result<bool, BenchError> {
    let load =
        |paths: &[std::path::PathBuf]| -> Result<Vec<(String, serde_json::Value)>, BenchError> {
            paths
                .iter()
                .map(|p| {
                    let text = std::fs::read_to_string(p)
                        .map_err(|e| BenchError::Report(format!("{}: {e}", p.display())))?;
                    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
                        BenchError::Report(format!("{}: not a bench report: {e}", p.display()))
                    })?;
                    let label = v["label"]
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| p.display().to_string());
                    Ok((label, v))
                })
                .collect()
        };
    match table {
        TableCommand::Compare { reports } => print!("{}", report::compare_table(&load(&reports)?)),
        TableCommand::Curve { reports } => print!("{}", report::curve_table(&load(&reports)?)),
        TableCommand::Groups(_) | TableCommand::Webhooks(_) | TableCommand::Native(_) => {
            unreachable!("run, not tables")
        }
    }
    Ok(true)
}
