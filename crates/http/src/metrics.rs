//! `GET /metrics`: Prometheus text for the whole node. The engine writes its own
//! families (object stores, WAL, streams, appends, reads); this adds the edge's.
//! Served on the API port (a reserved path no stream can shadow) and, with
//! `--admin-listen`, on the admin port too.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::Response;
use axum::response::IntoResponse;
use axum::Extension;
use picomq_engine::metrics::{Desc, Exposition};

use crate::app::AppState;
use crate::auth::{Access, Op, Principal};

static LIVE_READERS: Desc = Desc::gauge("picomq_live_readers", "Open SSE connections.");
static SENDFILE_BYTES: Desc = Desc::counter(
    "picomq_http_sendfile_bytes_total",
    "Response bytes the HTTP/1.1 loop sent from the local store's files with sendfile.",
);

/// With auth on, only for tokens with the admin scope.
pub async fn metrics(
    State(app): State<Arc<AppState>>,
    principal: Option<Extension<Principal>>,
) -> Response<Body> {
    if let Err(e) = Access::new(app.auth.as_ref(), principal.as_deref()).node(Op::Admin) {
        return e.into_response();
    }
    let mut out = Exposition::new();
    app.engine.write_metrics(&mut out).await;
    if let Some(edge) = &app.cluster {
        picomq_engine::metrics::Source::export(&edge.stats, &mut out);
    }
    picomq_engine::metrics::Source::export(&*app.consumers.subscriptions, &mut out);
    app.consumers.groups.export(&mut out).await;
    app.tables.export(&mut out);
    out.value(&LIVE_READERS, &[], app.live_readers.load(Relaxed) as f64);
    out.value(&SENDFILE_BYTES, &[], crate::h1::sendfile_bytes() as f64);
    Response::builder()
        .header("content-type", "text/plain; version=0.0.4")
        .header("cache-control", "no-store")
        .body(Body::from(out.finish()))
        .expect("valid response")
}
