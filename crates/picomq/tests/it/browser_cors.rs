//! Browsers: CORS preflights from a listed origin pass (before authentication, as
//! browsers send no credentials with them), an unlisted origin is refused, and the
//! protocol's response headers are exposed.

use picomq_testkit as support;

use picomq_client::HttpMethod;
use support::*;

const APP: &str = "https://app.example.com";

#[tokio::test]
async fn preflight_from_listed_origin_passes_and_unlisted_is_refused() {
    let dir = TempDir::new("cors");
    let s = start_with_auth(
        dir.path(),
        &[
            "--cors-origins",
            "https://app.example.com, http://localhost:3000",
        ],
    )
    .await;
    let preflight = |origin: &'static str| {
        let s = &s;
        async move {
            s.client
                .send(
                    HttpMethod::OPTIONS,
                    "/chat/1",
                    &[
                        ("origin", origin),
                        ("access-control-request-method", "POST"),
                        (
                            "access-control-request-headers",
                            "authorization, content-type, producer-id",
                        ),
                    ],
                    "",
                )
                .await
                .unwrap()
        }
    };
    let r = preflight(APP).await;
    assert_eq!(r.status.as_u16(), 204, "{}", r.text());
    assert_eq!(r.header("access-control-allow-origin"), Some(APP));
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(r.header("vary"), Some("origin"));
    let allowed = r.header("access-control-allow-headers").unwrap();
    for h in ["authorization", "content-type", "producer-id", "stream-seq"] {
        assert!(allowed.contains(h), "{h} not in {allowed}");
    }
    assert!(r
        .header("access-control-allow-methods")
        .unwrap()
        .contains("POST"));

    let r = preflight("https://evil.example.com").await;
    assert_eq!(r.status.as_u16(), 403);
    assert_eq!(r.header("access-control-allow-origin"), None);
    assert!(r.text().contains("cors_origin_not_allowed"));

    // An actual request from the listed origin: the origin is echoed, headers exposed;
    // from another origin no Allow-Origin, so the browser hides the answer.
    let admin = bearer(ADMIN_SECRET);
    let r = s
        .client
        .put("/chat/1", &[("origin", APP), ("authorization", &admin)], "")
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 201);
    assert_eq!(r.header("access-control-allow-origin"), Some(APP));
    let exposed = r.header("access-control-expose-headers").unwrap();
    for h in [
        "stream-next-offset",
        "stream-cursor",
        "stream-up-to-date",
        "stream-closed",
        "etag",
        "location",
    ] {
        assert!(exposed.contains(h), "{h} not exposed: {exposed}");
    }
    let r = s
        .client
        .send(
            HttpMethod::GET,
            "/chat/1",
            &[
                ("origin", "https://evil.example.com"),
                ("authorization", &admin),
            ],
            "",
        )
        .await
        .unwrap();
    assert_eq!(r.header("access-control-allow-origin"), None);
}

#[tokio::test]
async fn default_allows_any_origin_without_credentials() {
    let dir = TempDir::new("cors-any");
    let s = Server::start(dir.path(), &[]).await;
    let r = s
        .client
        .send(
            HttpMethod::OPTIONS,
            "/x",
            &[("origin", APP), ("access-control-request-method", "PUT")],
            "",
        )
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 204);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert_eq!(r.header("access-control-allow-credentials"), None);
}

#[test]
fn bad_origin_lists_are_refused_at_start() {
    let dir = TempDir::new("cors-bad");
    for bad in [
        "*, https://a.example",
        "app.example.com",
        "https://a.example/path",
        "",
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_picomq"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--cors-origins",
                bad,
                "--data-dir",
            ])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad:?} accepted");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--cors-origins"),
            "{bad:?}"
        );
    }
}
