//! Configuring `picomq serve`: flags beat PICOMQ_* variables, which beat the TOML
//! file (`--config`), which beats the built-in defaults; a bad value anywhere stops
//! start-up with a message naming the option; `--help` shows every default.

use picomq_testkit as support;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use picomq_client::Client;
use support::{free_port, TempDir};

/// Starts `picomq serve` with exactly these arguments and environment (no implied
/// flags) and waits until it is ready at `port`.
async fn start(dir: &Path, port: u16, args: &[&str], env: &[(&str, &str)]) -> (Child, Client) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_picomq"));
    cmd.arg("serve")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    clear_picomq_env(&mut cmd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let client = Client::new(&format!("http://127.0.0.1:{port}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = client.get("/readyz").await {
            if r.status.as_u16() == 200 {
                return (child, client);
            }
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "server exited at start-up"
        );
        assert!(Instant::now() < deadline, "server not ready at port {port}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn clear_picomq_env(cmd: &mut Command) {
    for (k, _) in std::env::vars() {
        if k.starts_with("PICOMQ_") {
            cmd.env_remove(k);
        }
    }
}

/// Runs `picomq serve` expecting it to refuse to start.
fn refuse(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_picomq"));
    cmd.arg("serve")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null());
    clear_picomq_env(&mut cmd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("serve {args:?} started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out: Output = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "serve {args:?} exited successfully");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The largest append a server accepts, probed with bodies of these sizes.
async fn accepts(client: &Client, bytes: usize) -> bool {
    let r = client
        .post(
            "/probe",
            &[("content-type", "text/plain")],
            "x".repeat(bytes),
        )
        .await
        .unwrap();
    match r.status.as_u16() {
        204 => true,
        413 => false,
        s => panic!("unexpected {s}: {}", r.text()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flag_beats_env_beats_file_beats_default() {
    let dir = TempDir::new("config-precedence");
    let file_port = free_port();
    let config = dir.path().join("picomq.toml");
    std::fs::write(
        &config,
        format!(
            "# options are flag names\nlisten = \"127.0.0.1:{file_port}\"\nmax_append_bytes = 100\nlong-poll-timeout = \"1s\"\n"
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap().to_string();
    let data = |n: &str| dir.path().join(n).to_str().unwrap().to_string();

    // File only: it sets the port and the append limit.
    let d = data("d1");
    let (mut child, client) = start(
        dir.path(),
        file_port,
        &["--config", &config, "--data-dir", &d],
        &[],
    )
    .await;
    assert_eq!(
        client
            .put("/probe", &[("content-type", "text/plain")], "")
            .await
            .unwrap()
            .status
            .as_u16(),
        201
    );
    assert!(accepts(&client, 100).await);
    assert!(!accepts(&client, 150).await);
    let _ = child.kill();
    let _ = child.wait();

    // PICOMQ_CONFIG finds the file too; the environment overrides it.
    let env_port = free_port();
    let listen = format!("127.0.0.1:{env_port}");
    let d = data("d2");
    let env = [
        ("PICOMQ_CONFIG", config.as_str()),
        ("PICOMQ_MAX_APPEND_BYTES", "200"),
        ("PICOMQ_LISTEN", listen.as_str()),
        ("PICOMQ_DATA_DIR", d.as_str()),
    ];
    let (mut child, client) = start(dir.path(), env_port, &[], &env).await;
    assert_eq!(
        client
            .put("/probe", &[("content-type", "text/plain")], "")
            .await
            .unwrap()
            .status
            .as_u16(),
        201
    );
    assert!(accepts(&client, 150).await);
    assert!(!accepts(&client, 250).await);
    // Not overridden: the file's long-poll timeout (1s, not the 25s default).
    let started = Instant::now();
    let r = client
        .get("/probe?offset=now&live=long-poll")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 204);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "long-poll took {:?}",
        started.elapsed()
    );
    let _ = child.kill();
    let _ = child.wait();

    // A flag overrides both.
    let flag_port = free_port();
    let listen = format!("127.0.0.1:{flag_port}");
    let d = data("d3");
    let env = [
        ("PICOMQ_CONFIG", config.as_str()),
        ("PICOMQ_MAX_APPEND_BYTES", "200"),
        ("PICOMQ_DATA_DIR", d.as_str()),
    ];
    let (mut child, client) = start(
        dir.path(),
        flag_port,
        &["--listen", &listen, "--max-append-bytes", "300"],
        &env,
    )
    .await;
    assert_eq!(
        client
            .put("/probe", &[("content-type", "text/plain")], "")
            .await
            .unwrap()
            .status
            .as_u16(),
        201
    );
    assert!(accepts(&client, 250).await);
    assert!(!accepts(&client, 350).await);
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn invalid_configuration_fails_at_start_naming_the_option() {
    let dir = TempDir::new("config-invalid");
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let bad_value = file("bad-value.toml", "long_poll_timeout = \"soon\"\n");
    let err = refuse(dir.path(), &["--config", &bad_value], &[]);
    assert!(
        err.contains("long-poll-timeout") && err.contains("bad-value.toml"),
        "{err}"
    );
    let unknown = file("unknown.toml", "listen_adress = \"0.0.0.0:1\"\n");
    let err = refuse(dir.path(), &["--config", &unknown], &[]);
    assert!(err.contains("listen-adress"), "{err}");
    let syntax = file("syntax.toml", "listen = \n");
    let err = refuse(dir.path(), &["--config", &syntax], &[]);
    assert!(err.contains("syntax.toml"), "{err}");
    let table = file("table.toml", "[server]\nlisten = \"x\"\n");
    let err = refuse(dir.path(), &["--config", &table], &[]);
    assert!(err.contains("server"), "{err}");
    let err = refuse(dir.path(), &["--config", "/nonexistent/picomq.toml"], &[]);
    assert!(err.contains("/nonexistent/picomq.toml"), "{err}");
    let err = refuse(dir.path(), &[], &[("PICOMQ_MAX_APPEND_BYTES", "many")]);
    assert!(err.contains("max-append-bytes"), "{err}");
    let err = refuse(dir.path(), &["--max-append-bytes", "0"], &[]);
    assert!(err.contains("max-append-bytes"), "{err}");
    let err = refuse(dir.path(), &["--log-format", "yaml"], &[]);
    assert!(err.contains("log-format"), "{err}");
    let err = refuse(dir.path(), &["--wal-overlap-after", "soon"], &[]);
    assert!(err.contains("wal-overlap-after"), "{err}");
}

#[test]
fn help_documents_every_option_with_its_default() {
    let out = Command::new(env!("CARGO_BIN_EXE_picomq"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    // Split the help into one block per option.
    let mut blocks: Vec<(String, String)> = Vec::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("--")
            || (trimmed.starts_with('-')
                && trimmed
                    .chars()
                    .nth(1)
                    .is_some_and(|c| c.is_ascii_alphabetic())
                && trimmed.contains(", --"))
        {
            let name = trimmed
                .split([' ', ',', '<'])
                .find(|w| w.starts_with("--"))
                .unwrap_or(trimmed)
                .to_string();
            blocks.push((name, String::new()));
        }
        if let Some((_, text)) = blocks.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    assert!(blocks.len() > 20, "options found: {}", blocks.len());
    for (name, text) in &blocks {
        if name == "--help" || name == "--version" {
            continue;
        }
        assert!(
            text.contains("[default"),
            "{name} does not show its default:\n{text}"
        );
        assert!(
            text.contains("[env: PICOMQ_"),
            "{name} has no PICOMQ_* variable:\n{text}"
        );
    }
}
