//! The server-wide shutdown signal: `serve` fires it once on SIGTERM/SIGINT; live
//! readers (SSE, long-poll) select on it so they answer and end at once instead of
//! holding the drain open until their timeouts, and `/readyz` turns 503.

use tokio::sync::watch;

/// Fires the signal; dropping it without firing leaves the signal pending forever.
pub struct ShutdownTrigger(watch::Sender<bool>);

/// Cheap to clone; every clone sees the one trigger.
#[derive(Clone, Debug)]
pub struct ShutdownSignal(watch::Receiver<bool>);

impl ShutdownTrigger {
    pub fn fire(&self) {
        self.0.send_replace(true);
    }
}

impl ShutdownSignal {
    pub fn new() -> (ShutdownTrigger, ShutdownSignal) {
        let (tx, rx) = watch::channel(false);
        (ShutdownTrigger(tx), ShutdownSignal(rx))
    }

    /// A signal that never fires (embedding the router without a shutdown story).
    pub fn never() -> ShutdownSignal {
        let (tx, rx) = watch::channel(false);
        // The receiver would see a dropped sender as "closed"; keep it alive instead.
        std::mem::forget(tx);
        ShutdownSignal(rx)
    }

    pub fn is_fired(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the signal fires (at once if it already has).
    pub async fn fired(&self) {
        let mut rx = self.0.clone();
        if rx.wait_for(|fired| *fired).await.is_err() {
            // Trigger dropped without firing: nothing will ever shut this down.
            std::future::pending::<()>().await;
        }
    }
}

impl Default for ShutdownSignal {
    fn default() -> Self {
        ShutdownSignal::never()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn fires_for_every_clone_and_late_waiters() {
        let (trigger, signal) = ShutdownSignal::new();
        let early = signal.clone();
        let waiter = tokio::spawn(async move { early.fired().await });
        assert!(!signal.is_fired());
        trigger.fire();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("early waiter woke")
            .unwrap();
        assert!(signal.is_fired());
        // Waiting after the fact returns at once.
        tokio::time::timeout(Duration::from_secs(5), signal.fired())
            .await
            .expect("late waiter returns at once");
    }

    #[tokio::test]
    async fn never_stays_pending() {
        let signal = ShutdownSignal::never();
        let r = tokio::time::timeout(Duration::from_millis(50), signal.fired()).await;
        assert!(r.is_err());
    }
}
