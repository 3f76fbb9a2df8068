//! `picomq-s3-test-server --listen 127.0.0.1:9000 --root DIR --bucket NAME...`:
//! the test S3 server as a process, for CI scripts (see `.ci/s3-server.sh`).

use std::path::PathBuf;

fn usage() -> ! {
    eprintln!("usage: picomq-s3-test-server --listen ADDR --root DIR [--bucket NAME]...");
    std::process::exit(2)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut listen = None;
    let mut root = None;
    let mut buckets = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--listen" => listen = Some(value),
            "--root" => root = Some(PathBuf::from(value)),
            "--bucket" => buckets.push(value),
            _ => usage(),
        }
    }
    let (Some(listen), Some(root)) = (listen, root) else {
        usage()
    };
    if let Err(e) = std::fs::create_dir_all(&root) {
        eprintln!("picomq-s3-test-server: --root {}: {e}", root.display());
        std::process::exit(1);
    }
    let listener = match tokio::net::TcpListener::bind(&listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("picomq-s3-test-server: --listen {listen}: {e}");
            std::process::exit(1);
        }
    };
    let names: Vec<&str> = buckets.iter().map(String::as_str).collect();
    match picomq_s3_test_server::start(listener, &root, &names).await {
        Ok(server) => {
            println!("picomq-s3-test-server listening on {}", server.endpoint());
            let _ = tokio::signal::ctrl_c().await;
        }
        Err(e) => {
            eprintln!("picomq-s3-test-server: {e}");
            std::process::exit(1);
        }
    }
}
