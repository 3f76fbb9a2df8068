//! `picomq`: the one binary. `serve` runs the server; the client commands (`cli`),
//! admin and benchmark commands talk HTTP to any server.

mod cli;
mod config_file;
mod serve;
mod storage;

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc malloc: the request path allocates a few dozen small
/// objects per append across threads, where glibc spent ~16% of the server's
/// instructions (benchmarks/results/profile.txt).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "picomq",
    version,
    about = "Durable, real-time streams over HTTP, stored in object storage"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (defaults: 127.0.0.1:4437, data in ./picomq-data).
    Serve(Box<serve::ServeArgs>),
    /// Benchmark any Durable Streams server (appends, live and catch-up reads, costs).
    Bench(Box<picomq_bench::BenchArgs>),
    #[command(flatten)]
    Client(cli::ClientCommand),
}

fn main() -> std::process::ExitCode {
    let cli: Cli = config_file::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match cli.command {
        Command::Serve(args) => runtime.block_on(serve::run(*args)),
        Command::Bench(args) => runtime.block_on(picomq_bench::run(*args)),
        Command::Client(command) => runtime.block_on(cli::run(command)),
    }
}
