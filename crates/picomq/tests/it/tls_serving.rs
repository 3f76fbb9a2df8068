//! HTTPS without a proxy: the server speaks the protocol over TLS (rustls, HTTP/1.1
//! and HTTP/2 by ALPN) with a certificate made here by the `openssl` CLI, and swaps
//! in a new certificate on SIGHUP (keeping the old one if the new files are bad).
//! curl is the client, checking the chain against the test's own certificate.

use picomq_testkit as support;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use support::*;

fn make_cert(dir: &Path, name: &str) {
    let out = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .arg("-keyout")
        .arg(dir.join(format!("{name}.key")))
        .arg("-out")
        .arg(dir.join(format!("{name}.pem")))
        .args([
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .output()
        .expect("the TLS tests need the openssl CLI to make a certificate");
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn curl(ca: &Path, args: &[&str]) -> Output {
    Command::new("curl")
        .args(["-sS", "--max-time", "5", "--cacert"])
        .arg(ca)
        .args(args)
        .output()
        .expect("the TLS tests need curl")
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn serves_the_protocol_over_tls_and_reloads_on_sighup() {
    let dir = TempDir::new("tls");
    let d = dir.path();
    make_cert(d, "first");
    make_cert(d, "second");
    std::fs::copy(d.join("first.pem"), d.join("cert.pem")).unwrap();
    std::fs::copy(d.join("first.key"), d.join("key.pem")).unwrap();
    let port = free_port();
    let log = std::fs::File::create(d.join("server.log")).unwrap();
    let server = Killed(
        Command::new(env!("CARGO_BIN_EXE_picomq"))
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--data-dir",
            ])
            .arg(d.join("data"))
            .arg("--tls-cert")
            .arg(d.join("cert.pem"))
            .arg("--tls-key")
            .arg(d.join("key.pem"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let base = format!("https://127.0.0.1:{port}");
    let first = d.join("first.pem");
    let second = d.join("second.pem");
    eventually(Duration::from_secs(30), || async {
        let out = curl(&first, &[&format!("{base}/readyz")]);
        (String::from_utf8_lossy(&out.stdout) == "ready\n").then_some(())
    })
    .await;

    // The protocol over HTTPS: create, append, read, over HTTP/1.1 and HTTP/2.
    let url = format!("{base}/tls/stream");
    let out = curl(
        &first,
        &[
            "-X",
            "PUT",
            "-H",
            "content-type: text/plain",
            "-w",
            "%{http_code}",
            &url,
        ],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "201");
    let out = curl(
        &first,
        &[
            "-X",
            "POST",
            "-H",
            "content-type: text/plain",
            "--data-binary",
            "over tls",
            "-w",
            "%{http_code}",
            "--http1.1",
            &url,
        ],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "204");
    let out = curl(
        &first,
        &[
            "--http2",
            "-w",
            " %{http_version}",
            &format!("{url}?offset=-1"),
        ],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "over tls 2");

    // The CLI over HTTPS: it trusts the test's self-signed certificate given with
    // --ca-cert (over HTTP/1.1 and HTTP/2), and nothing else: not without it (the
    // system's trust store), not with another certificate, not under another name.
    let cli = cli::Cli::new(&base);
    let ca = first.to_str().unwrap();
    let run = cli.run(&["create", "tls/cli", "--ca-cert", ca]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let run = cli
        .run_with_stdin(&["append", "tls/cli", "--ca-cert", ca], b"via cli\n")
        .await;
    assert_eq!(run.code, 0, "{run:?}");
    for http2 in [false, true] {
        let mut args = vec!["read", "tls/cli", "--ca-cert", ca];
        if http2 {
            args.push("--http2");
        }
        let run = cli.run(&args).await;
        assert_eq!(run.code, 0, "{run:?}");
        assert_eq!(run.stdout, "via cli\n", "{run:?}");
    }
    let other = second.to_str().unwrap();
    for args in [
        vec!["read", "tls/cli"],
        vec!["read", "tls/cli", "--ca-cert", other],
        vec![
            "read",
            "tls/cli",
            "--ca-cert",
            ca,
            "--url",
            &format!("https://localhost:{port}"),
        ],
    ] {
        let run = cli.run(&args).await;
        // A refused certificate is not retried: exit 2 at once, with the reason.
        assert_eq!(run.code, 2, "{args:?} must fail: {run:?}");
        assert!(run.stderr.contains("certificate"), "{run:?}");
    }
    let run = cli
        .run(&[
            "read",
            "tls/cli",
            "--ca-cert",
            d.join("server.log").to_str().unwrap(),
        ])
        .await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("no PEM certificate"), "{run:?}");
    // Plain HTTP on the TLS port is not served.
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "5",
            &format!("http://127.0.0.1:{port}/healthz"),
        ])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ok"));
    // The second certificate is not trusted yet: the server presents the first.
    assert!(!curl(&second, &[&format!("{base}/healthz")])
        .status
        .success());

    // SIGHUP with new files: new connections get the new certificate.
    std::fs::copy(d.join("second.pem"), d.join("cert.pem")).unwrap();
    std::fs::copy(d.join("second.key"), d.join("key.pem")).unwrap();
    let hup = |pid: u32| {
        Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .unwrap()
    };
    assert!(hup(server.0.id()).success());
    eventually(Duration::from_secs(10), || async {
        curl(&second, &[&format!("{base}/healthz")])
            .status
            .success()
            .then_some(())
    })
    .await;
    assert!(!curl(&first, &[&format!("{base}/healthz")]).status.success());

    // A broken file on SIGHUP: logged, and the server keeps the certificate it has.
    std::fs::write(d.join("cert.pem"), "not a certificate").unwrap();
    assert!(hup(server.0.id()).success());
    eventually(Duration::from_secs(10), || async {
        std::fs::read_to_string(d.join("server.log"))
            .unwrap()
            .contains("TLS reload failed")
            .then_some(())
    })
    .await;
    let out = curl(&second, &[&format!("{url}?offset=-1")]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "over tls");
}

#[test]
fn bad_certificate_files_are_refused_at_start() {
    let dir = TempDir::new("tls-bad");
    std::fs::write(dir.path().join("c.pem"), "garbage").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_picomq"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .arg("--tls-cert")
        .arg(dir.path().join("c.pem"))
        .arg("--tls-key")
        .arg(dir.path().join("missing.pem"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--tls-"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // --tls-cert alone is a usage error.
    let out = Command::new(env!("CARGO_BIN_EXE_picomq"))
        .args(["serve", "--tls-cert", "x.pem"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
