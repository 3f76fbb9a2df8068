//! `picomq token create | ls | revoke` against a server with `--auth required`: the
//! secret is printed once and works with exactly its scopes, listing never shows
//! secrets, revocation takes effect at once, and failures map to the auth exit code.

use picomq_testkit as support;

use support::cli::Cli;
use support::*;

#[tokio::test]
async fn token_commands_issue_list_and_revoke() {
    let dir = TempDir::new("cli-tokens");
    let s = start_with_auth(dir.path(), &[]).await;
    let cli = Cli::new(&s.url);
    let admin = ["--token", ADMIN_SECRET];

    // Without --token: the auth exit code, and a message saying what is needed.
    let r = cli.run(&["token", "ls"]).await;
    assert_eq!(r.code, 5, "{r:?}");
    assert!(r.stderr.contains("--token"), "{r:?}");

    let r = cli
        .run(
            &[
                &[
                    "token",
                    "create",
                    "--scope",
                    "create,append,read:logs/**",
                    "--expires-in",
                    "1h",
                    "--description",
                    "ingest",
                ][..],
                &admin[..],
            ]
            .concat(),
        )
        .await;
    assert_eq!(r.code, 0, "{r:?}");
    let secret = r.stdout.trim().to_string();
    assert!(secret.starts_with("pmq_") && !secret.contains(' '), "{r:?}");
    assert!(r.stderr.contains("shown only once"));

    // The new token works within its scopes, and only there.
    let mine = ["--token", secret.as_str()];
    assert_eq!(
        cli.run(&[&["create", "logs/app"][..], &mine[..]].concat())
            .await
            .code,
        0
    );
    assert_eq!(
        cli.run_with_stdin(&[&["append", "logs/app"][..], &mine[..]].concat(), b"one\n")
            .await
            .code,
        0
    );
    let r = cli
        .run(&[&["read", "logs/app"][..], &mine[..]].concat())
        .await;
    assert_eq!(r.stdout, "one\n", "{r:?}");
    let r = cli
        .run(&[&["create", "other"][..], &mine[..]].concat())
        .await;
    assert_eq!(r.code, 5, "{r:?}");
    let r = cli
        .run(&[&["rm", "logs/app"][..], &mine[..]].concat())
        .await;
    assert_eq!(r.code, 5, "{r:?}");

    // A scope written with the leading slash of a path means the same names.
    let r = cli
        .run(
            &[
                &["token", "create", "--scope", "read:/logs/*"][..],
                &admin[..],
            ]
            .concat(),
        )
        .await;
    assert_eq!(r.code, 0, "{r:?}");
    let slashed = r.stdout.trim().to_string();
    let r = cli.run(&["read", "/logs/app", "--token", &slashed]).await;
    assert_eq!((r.code, r.stdout.as_str()), (0, "one\n"), "{r:?}");

    // Listing (text and JSON) shows ids and scopes, never secrets.
    let r = cli.run(&[&["token", "ls"][..], &admin[..]].concat()).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("create,append,read:logs/**"), "{r:?}");
    assert!(r.stdout.contains("ingest") && r.stdout.contains("bootstrap"));
    assert!(!r.stdout.contains(&secret) && !r.stdout.contains(ADMIN_SECRET));
    let r = cli
        .run(&[&["token", "ls", "--output", "json"][..], &admin[..]].concat())
        .await;
    let tokens = r.json()["tokens"].as_array().unwrap().clone();
    let id = tokens
        .iter()
        .find(|t| t["description"] == "ingest")
        .and_then(|t| t["id"].as_str())
        .unwrap()
        .to_string();

    // A token cannot issue more than it holds (no tokens scope here at all).
    let r = cli
        .run(
            &[
                &["token", "create", "--scope", "read:logs/**"][..],
                &mine[..],
            ]
            .concat(),
        )
        .await;
    assert_eq!(r.code, 5, "{r:?}");
    let r = cli
        .run(&[&["token", "create", "--scope", "fly:x"][..], &admin[..]].concat())
        .await;
    assert_eq!(r.code, 2, "{r:?}");

    // Revoke: the next command with it fails at once.
    let r = cli
        .run(&[&["token", "revoke", &id][..], &admin[..]].concat())
        .await;
    assert_eq!(r.code, 0, "{r:?}");
    let r = cli
        .run(&[&["read", "logs/app"][..], &mine[..]].concat())
        .await;
    assert_eq!(r.code, 5, "{r:?}");
    assert!(r.stderr.contains("revoked"), "{r:?}");
    let r = cli
        .run(&[&["token", "revoke", "tok_doesnotexist"][..], &admin[..]].concat())
        .await;
    assert_eq!(r.code, 3, "{r:?}");
}
