//! A TCP relay that can cut every connection through it: a network partition
//! between the processes a test starts and a real server (Postgres), on loopback.
//! While cut, open connections are closed and new ones are accepted and closed at
//! once, as when a route to a host is gone and comes back.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

pub struct TcpCut {
    pub port: u16,
    cut: Arc<AtomicBool>,
    relays: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl TcpCut {
    /// Relays 127.0.0.1:`port` (a free one) to `target`.
    pub async fn start(target: SocketAddr) -> TcpCut {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let port = listener.local_addr().expect("relay address").port();
        let cut = Arc::new(AtomicBool::new(false));
        let relays: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = {
            let (cut, relays) = (cut.clone(), relays.clone());
            tokio::spawn(async move {
                loop {
                    let Ok((mut client, _)) = listener.accept().await else {
                        continue;
                    };
                    if cut.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    let relay = tokio::spawn(async move {
                        if let Ok(mut server) = TcpStream::connect(target).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                    let mut relays = relays.lock().expect("relays");
                    relays.retain(|r| !r.is_finished());
                    relays.push(relay.abort_handle());
                }
            })
            .abort_handle()
        };
        TcpCut {
            port,
            cut,
            relays,
            accept,
        }
    }

    /// Closes every connection through the relay and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for relay in self.relays.lock().expect("relays").drain(..) {
            relay.abort();
        }
    }

    /// Lets connections through again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for TcpCut {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
