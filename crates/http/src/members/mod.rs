//! A cluster member's edge as far as it needs no request state: the headers
//! members exchange, how a client is sent to a stream's owner (`RouteMode`), the
//! forwarding proxy (`proxy`), the client of the members' calls to each other
//! (`client`, the engine's `Peers`), and the routing counters. The handlers that
//! use them are `cluster`'s.

pub mod client;
mod proxy;

use std::sync::Arc;

use picomq_engine::metrics::{Counter, Desc, Exposition, Source};
pub use proxy::{redirect, ForwardError, Proxy};

/// Set on a request one member forwards to another: the sender's node id.
pub const FORWARDED_BY: &str = "picomq-forwarded-by";
/// Set on every stream answer of a cluster member: the node id of the member that
/// served it (a forwarded answer carries the owner's).
pub const SERVED_BY: &str = "picomq-served-by";
/// Set on a 503 answer from a member that does not serve the stream (any more).
pub const NOT_OWNER: &str = "picomq-not-owner";
/// How members prove to each other that a call comes from the cluster.
pub const CLUSTER_KEY: &str = "picomq-cluster-key";

/// How a member sends a client to the stream's owner.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RouteMode {
    /// Forward the request and stream the owner's answer back.
    #[default]
    Proxy,
    /// Answer 307 with the owner's URL (clients that follow redirects re-send).
    Redirect,
}

impl std::str::FromStr for RouteMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "proxy" => Ok(RouteMode::Proxy),
            "redirect" => Ok(RouteMode::Redirect),
            _ => Err(format!("{s:?}: use proxy or redirect")),
        }
    }
}

impl std::fmt::Display for RouteMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RouteMode::Proxy => "proxy",
            RouteMode::Redirect => "redirect",
        })
    }
}

/// What the edge of a member holds.
pub struct ClusterEdge {
    /// This member's node id, as the [`SERVED_BY`] header value.
    pub node_id: axum::http::HeaderValue,
    pub mode: RouteMode,
    pub proxy: Proxy,
    /// The key members present to each other ([`CLUSTER_KEY`]).
    pub key: String,
    /// Calls to other members (the engine's, and the subscriptions').
    pub peers: Arc<client::PeerClient>,
    pub stats: EdgeStats,
}

static FORWARDED: Desc = Desc::counter(
    "picomq_cluster_requests_forwarded_total",
    "Stream requests this node forwarded to the node serving the stream.",
);
static REDIRECTED: Desc = Desc::counter(
    "picomq_cluster_requests_redirected_total",
    "Stream requests this node answered with a redirect to the node serving the stream.",
);
static STALE_ROUTES: Desc = Desc::counter(
    "picomq_cluster_stale_routes_total",
    "Forwarded requests the receiving member did not serve (the slot had moved on); routed again.",
);
static FORWARD_FAILURES: Desc = Desc::counter(
    "picomq_cluster_forward_failures_total",
    "Forwarding attempts that could not reach the owner (retried once it changed, or 503).",
);

pub struct EdgeStats {
    pub forwarded: Counter,
    pub redirected: Counter,
    pub forward_failures: Counter,
    pub stale_routes: Counter,
}

impl Default for EdgeStats {
    fn default() -> Self {
        EdgeStats {
            forwarded: Counter::new(&FORWARDED),
            redirected: Counter::new(&REDIRECTED),
            forward_failures: Counter::new(&FORWARD_FAILURES),
            stale_routes: Counter::new(&STALE_ROUTES),
        }
    }
}

impl Source for EdgeStats {
    fn export(&self, out: &mut Exposition) {
        out.counter(&self.forwarded)
            .counter(&self.redirected)
            .counter(&self.forward_failures)
            .counter(&self.stale_routes);
    }
}
