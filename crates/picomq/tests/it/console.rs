//! The web console's files as the binary serves them, on the API port and on
//! `--admin-listen`: served without a token even with `--auth required` (they hold
//! no data), under a Content-Security-Policy that lets the page load nothing but
//! itself, revalidated by ETag, small, and referring to no other origin. The page
//! itself is driven in a real browser by tests-browser/console.mjs.

use picomq_testkit as support;

use picomq_client::{Client, HttpMethod};
use support::{free_port, start_with_auth_as, TempDir};

const FILES: [(&str, &str); 3] = [
    ("/__picomq/console", "text/html"),
    ("/__picomq/console/app.js", "text/javascript"),
    ("/__picomq/console/app.css", "text/css"),
];

/// Everything the page loads together, uncompressed: kept well under this.
const CONSOLE_BYTES_MAX: usize = 160 * 1024;

async fn check_files(client: &Client, port_name: &str) {
    let mut total = 0;
    for (path, content_type) in FILES {
        let r = client.get(path).await.expect("request");
        assert_eq!(r.status.as_u16(), 200, "{port_name} {path}: {}", r.text());
        let ct = r.header("content-type").unwrap_or_default();
        assert!(ct.starts_with(content_type), "{port_name} {path}: {ct}");
        let csp = r.header("content-security-policy").unwrap_or_default();
        for directive in [
            "default-src 'self'",
            "script-src 'self'",
            "style-src 'self'",
            "connect-src 'self'",
            "object-src 'none'",
            "frame-ancestors 'none'",
            "form-action 'none'",
        ] {
            assert!(csp.contains(directive), "{port_name} {path}: CSP {csp}");
        }
        assert!(!csp.contains("unsafe-"), "{port_name} {path}: CSP {csp}");
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(r.header("referrer-policy"), Some("no-referrer"));

        // Nothing from another origin: no scheme-qualified or protocol-relative URL
        // in any file (the page's requests are all to its own server).
        let text = r.text();
        for needle in ["http://", "https://", "src=\"//", "href=\"//", "url(//"] {
            assert!(
                !text.contains(needle),
                "{port_name} {path} refers to {needle}"
            );
        }
        total += r.body.len();

        // Revalidation: the same bytes are a 304 with no body.
        let etag = r.header("etag").expect("an ETag").to_string();
        let again = client
            .send(HttpMethod::GET, path, &[("if-none-match", &etag)], "")
            .await
            .expect("request");
        assert_eq!(again.status.as_u16(), 304, "{port_name} {path}");
        assert!(again.body.is_empty());
    }
    assert!(
        total < CONSOLE_BYTES_MAX,
        "the console's files are {total} bytes"
    );

    // An unknown file is a JSON 404 saying where the console is.
    let r = client.get("/__picomq/console/nope.js").await.unwrap();
    assert_eq!(r.status.as_u16(), 404);
    let body: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON error body");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/__picomq/console"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_files_on_api_and_admin_ports_without_a_token() {
    let dir = TempDir::new("console-files");
    let admin_port = free_port();
    let admin_listen = format!("127.0.0.1:{admin_port}");
    let server = start_with_auth_as(dir.path(), &["--admin-listen", &admin_listen], true).await;
    check_files(&server.client, "API port").await;
    let admin = Client::new(&format!("http://{admin_listen}"));
    check_files(&admin, "admin port").await;

    // The files are public; what the page then asks for is not.
    let r = server.client.get("/__picomq/streams").await.unwrap();
    assert_eq!(r.status.as_u16(), 401, "{}", r.text());
    let r = server.client.get("/metrics").await.unwrap();
    assert_eq!(r.status.as_u16(), 401, "{}", r.text());
}
