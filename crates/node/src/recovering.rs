//! The stand-in server on a port while the node recovers: alive (`/healthz` 200)
//! but not ready; `/readyz` and every stream request get 503 with Retry-After.

use std::sync::Arc;
use std::time::Duration;

use picomq_http::server::{ServerOptions, Tls};
use picomq_http::{ShutdownSignal, ShutdownTrigger};
use tokio::net::TcpListener;

pub(crate) struct Recovering {
    stop: ShutdownTrigger,
    task: tokio::task::JoinHandle<()>,
}

/// Starts the stand-in on a duplicate of `listener`; hands the listener back for the
/// real server.
pub(crate) fn serve(
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
) -> Result<(TcpListener, Recovering), String> {
    let io = |e: std::io::Error| format!("--listen: duplicating the socket: {e}");
    // `into_std` leaves the socket non-blocking, as `from_std` requires.
    let listener = listener.into_std().map_err(io)?;
    let dup = listener.try_clone().map_err(io)?;
    let listener = TcpListener::from_std(listener).map_err(io)?;
    let dup = TcpListener::from_std(dup).map_err(io)?;
    let (stop, stopped) = ShutdownSignal::new();
    let options = ServerOptions {
        tls,
        ..ServerOptions::default()
    };
    let server =
        picomq_http::server::serve(dup, picomq_http::recovering_router(), options, stopped);
    let recovering = Recovering {
        stop,
        task: tokio::spawn(server),
    };
    Ok((listener, recovering))
}

impl Recovering {
    /// Stops accepting (connections waiting in the backlog go to the real server) and
    /// closes the stand-in's connections; clients see them close and reconnect.
    pub(crate) async fn stop(self) {
        self.stop.fire();
        if tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .is_err()
        {
            tracing::warn!("a connection opened during recovery did not close within 5s");
        }
    }
}
