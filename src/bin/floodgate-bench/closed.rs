//! The closed loop: a fixed number of requests in flight, each sent as soon as the one
//! before it on its worker was answered. It finds the most the server does at that
//! concurrency; latencies are only those of requests it managed to send (a stall holds the
//! next requests back instead of charging them), which the open loop is for.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::task::JoinHandle;

use super::Window;
use super::connection::Client;
use super::exchange::{RequestShape, exchange};
use super::outcome::Tally;

/// Starts `concurrency` workers spread over `clients`' connections. The returned task
/// resolves to their tally once the last of them has its answer.
pub fn start(
    clients: &[Client],
    concurrency: usize,
    shape: Arc<RequestShape>,
    timeout: Duration,
    window: Window,
) -> JoinHandle<anyhow::Result<Tally>> {
    let workers: Vec<_> = (0..concurrency)
        .map(|i| {
            let client = clients[i % clients.len()].clone();
            tokio::spawn(worker(client, shape.clone(), timeout, window))
        })
        .collect();
    tokio::spawn(async move {
        let mut total = Tally::default();
        for worker in workers {
            total.merge(worker.await.context("bench worker")?);
        }
        Ok(total)
    })
}

/// Sends one request at a time until the window ends; counts those sent inside it.
async fn worker(
    mut client: Client,
    shape: Arc<RequestShape>,
    timeout: Duration,
    window: Window,
) -> Tally {
    let mut tally = Tally::default();
    loop {
        let request = shape.request();
        let due = Instant::now();
        if due >= window.until {
            return tally;
        }
        let sample = exchange(&mut client, request, timeout, due).await;
        tally.counts.sent += 1;
        if window.measures(due) {
            tally.record(&sample);
        }
    }
}
