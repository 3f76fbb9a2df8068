//! Running the real binary's client commands (`picomq create|append|read|tail|...`)
//! against a test server, with a deadline on every run so a hang fails the test.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

/// No client command in a test may take longer than this.
pub const RUN_LIMIT: Duration = Duration::from_secs(60);

pub struct Cli {
    pub url: String,
}

#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }
}

impl Cli {
    pub fn new(url: &str) -> Cli {
        Cli {
            url: url.to_string(),
        }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(crate::picomq_bin());
        c.args(args)
            .env("PICOMQ_URL", &self.url)
            .env_remove("PICOMQ_TOKEN")
            .kill_on_drop(true);
        c
    }

    pub async fn run(&self, args: &[&str]) -> Run {
        self.run_with_stdin(args, b"").await
    }

    pub async fn run_with_stdin(&self, args: &[&str], stdin: &[u8]) -> Run {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn picomq");
        let mut pipe = child.stdin.take().expect("stdin");
        let input = stdin.to_vec();
        let writer = tokio::spawn(async move {
            let _ = pipe.write_all(&input).await;
        });
        let out = tokio::time::timeout(RUN_LIMIT, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("picomq {args:?} did not finish within {RUN_LIMIT:?}"))
            .expect("wait for picomq");
        let _ = writer.await;
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Starts a long-running command (`tail -f`) whose stdout is read line by line.
    pub fn spawn(&self, args: &[&str]) -> Follower {
        let mut child = self
            .command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn picomq");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Follower {
            child,
            stdout,
            lines: Vec::new(),
            args: args.join(" "),
        }
    }
}

/// A running `picomq tail -f` and the lines it has printed so far.
pub struct Follower {
    pub child: Child,
    stdout: BufReader<ChildStdout>,
    pub lines: Vec<String>,
    /// The command line, to name this follower in a failure.
    args: String,
}

impl Follower {
    /// Reads stdout until `count` lines in total have arrived; panics after `limit`.
    pub async fn wait_for_lines(&mut self, count: usize, limit: Duration) {
        if let Err(e) = self.try_wait_for_lines(count, limit).await {
            panic!("{e}");
        }
    }

    /// [`Follower::wait_for_lines`] that says what went wrong (with the follower's
    /// stderr so far) instead of panicking, so a test can add the server's log.
    pub async fn try_wait_for_lines(
        &mut self,
        count: usize,
        limit: Duration,
    ) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        while self.lines.len() < count {
            let mut line = String::new();
            let left = deadline.saturating_duration_since(Instant::now());
            let failure = match tokio::time::timeout(left, self.stdout.read_line(&mut line)).await {
                Ok(Ok(0)) => format!("ended after {} of {count} lines", self.lines.len()),
                Ok(Ok(_)) => {
                    self.lines
                        .push(line.strip_suffix('\n').unwrap_or(&line).to_string());
                    continue;
                }
                Ok(Err(e)) => format!("output unreadable: {e}"),
                Err(_) => format!(
                    "printed {} of {count} lines within {limit:?}; last: {:?}",
                    self.lines.len(),
                    self.lines.last()
                ),
            };
            let stderr = self.stderr().await;
            return Err(format!(
                "picomq {}: {failure}; stderr:\n{stderr}",
                self.args
            ));
        }
        Ok(())
    }

    /// Waits (bounded) for the process to exit; returns its exit code and reads the
    /// rest of stdout into `lines`.
    pub async fn wait_exit(&mut self, limit: Duration) -> i32 {
        let mut rest = String::new();
        tokio::time::timeout(
            limit,
            tokio::io::AsyncReadExt::read_to_string(&mut self.stdout, &mut rest),
        )
        .await
        .unwrap_or_else(|_| panic!("tail did not end within {limit:?}"))
        .expect("read tail output");
        self.lines.extend(rest.lines().map(str::to_string));
        let status = tokio::time::timeout(limit, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("tail did not exit within {limit:?}"))
            .expect("wait for tail");
        status.code().unwrap_or(-1)
    }

    /// What the follower wrote to stderr, waiting at most a second for more (it may
    /// still be running).
    async fn stderr(&mut self) -> String {
        let mut err = Vec::new();
        if let Some(mut e) = self.child.stderr.take() {
            let deadline = Instant::now() + Duration::from_secs(1);
            let mut buf = [0u8; 4096];
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, tokio::io::AsyncReadExt::read(&mut e, &mut buf))
                    .await
                {
                    Ok(Ok(n)) if n > 0 => err.extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
        }
        String::from_utf8_lossy(&err).into_owned()
    }
}
