//! The web console: three static files (HTML, JS, CSS) compiled into the binary and
//! served at `/__picomq/console` on the API port and on `--admin-listen`. The files
//! hold no data, so they are served without a token; every call the page makes goes
//! to the server's own JSON and metrics endpoints with the token the person gave it
//! (kept in the tab's `sessionStorage`), so those keep deciding what it may see.
//!
//! This module owns only serving the files: their content type, caching and the
//! Content-Security-Policy that lets the page load nothing but itself (no inline
//! script or style, no other origin, no framing, no form submissions).

use std::sync::Arc;
use std::sync::OnceLock;

use axum::body::Body;
use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use axum::routing::get;
use axum::Router;

use crate::app::AppState;
use crate::error::ApiError;

/// Where the console's page is.
pub const PATH: &str = "/__picomq/console";
/// Its files, by name (`app.js`, `app.css`).
pub const FILE_PATH: &str = "/__picomq/console/{file}";

/// Everything the page loads comes from this server; scripts and styles only from
/// their files (no inline code), no plugins, no `<base>`, no framing by other
/// pages, and no form is ever submitted by the browser (the script sends the
/// requests, so a token typed into a form cannot end up in a URL).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
    style-src 'self'; img-src 'self'; connect-src 'self'; object-src 'none'; \
    base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const INDEX: Asset = Asset {
    name: "index.html",
    content_type: "text/html; charset=utf-8",
    body: include_bytes!("assets/index.html"),
};

const FILES: [Asset; 2] = [
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/app.js"),
    },
    Asset {
        name: "app.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("assets/app.css"),
    },
];

/// The console's routes, for the API router and the admin router alike.
/// The console's index with a trailing `/`.
pub const INDEX_PATH: &str = "/__picomq/console/";
/// Every path [`routes`] serves.
pub const PATHS: &[&str] = &[PATH, INDEX_PATH, FILE_PATH];

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(PATH, get(index))
        .route(INDEX_PATH, get(index))
        .route(FILE_PATH, get(file))
}

async fn index(headers: HeaderMap) -> Response<Body> {
    serve(&INDEX, &headers)
}

async fn file(Path(name): Path<String>, headers: HeaderMap) -> Response<Body> {
    match FILES.iter().find(|a| a.name == name) {
        Some(asset) => serve(asset, &headers),
        None if name == INDEX.name => serve(&INDEX, &headers),
        None => axum::response::IntoResponse::into_response(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("the console has no file {name:?}; open {PATH}"),
        )),
    }
}

/// One file, revalidated on each load (`no-cache` with an ETag): a new binary's
/// console is never mixed with an old one's cached script.
fn serve(asset: &Asset, headers: &HeaderMap) -> Response<Body> {
    let etag = etag(asset);
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|v| v.as_bytes() == etag.as_bytes());
    let builder = Response::builder()
        .header(header::CACHE_CONTROL, "no-cache")
        .header(header::ETAG, etag.clone())
        .header(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        )
        .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff")
        .header(header::X_FRAME_OPTIONS, "DENY")
        .header(header::REFERRER_POLICY, "no-referrer");
    let response = if fresh {
        builder.status(StatusCode::NOT_MODIFIED).body(Body::empty())
    } else {
        builder
            .header(header::CONTENT_TYPE, asset.content_type)
            .body(Body::from(asset.body))
    };
    response.expect("static response")
}

/// A strong validator from the file's bytes (FNV-1a), computed once per file.
fn etag(asset: &Asset) -> HeaderValue {
    static TAGS: OnceLock<Vec<(&'static str, HeaderValue)>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        std::iter::once(&INDEX)
            .chain(FILES.iter())
            .map(|a| {
                let hash = a.body.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                    (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
                });
                let tag = HeaderValue::from_str(&format!("\"{hash:016x}\""))
                    .expect("hex digits and quotes");
                (a.name, tag)
            })
            .collect()
    });
    tags.iter()
        .find(|(name, _)| *name == asset.name)
        .map(|(_, tag)| tag.clone())
        .expect("every asset has a tag")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_text_without_inline_script() {
        let html = std::str::from_utf8(INDEX.body).expect("UTF-8");
        for tag in html.split("<script").skip(1) {
            let head = &tag[..tag.find('>').expect("a closed tag")];
            assert!(head.contains("src="), "inline script in index.html");
        }
        let handler = html.match_indices(" on").any(|(i, _)| {
            let rest = &html[i + 3..];
            let name = rest.bytes().take_while(u8::is_ascii_lowercase).count();
            name > 0 && rest.as_bytes().get(name) == Some(&b'=')
        });
        assert!(!handler, "inline event handler in index.html");
        assert!(!html.contains("style="), "inline style in index.html");
        for a in &FILES {
            std::str::from_utf8(a.body).expect("UTF-8");
        }
    }
}
