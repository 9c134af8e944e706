//! Redis Sentinel in motion: a primary lost under load, the old primary returning with the
//! data it had when it died, and a second failover that promotes it again, while clients of
//! two floodgate servers hammer many counters of every algorithm.
//!
//! What is asserted: answers fail only from a primary's loss until the sentinels agree on
//! its replacement plus the promised margin (docs/redis.md); the old primary's return costs
//! nothing and floodgate never counts on it while it still says it is a primary with its old
//! counts; every counter admits exactly its limit, but those live at a loss, which may admit
//! the writes the replica had not received (2 more at most).
//!
//! The traffic and its counting are `motion/mod.rs`'s.

mod harness;
mod motion;
mod redis_harness;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use motion::{Answer, MARGIN, Outcome, Traffic, assert_exact, reasons, tally};
use redis_harness::sentinel::Sentinels;

/// The data servers keep every write on disk (as a primary that must come back with its data
/// is configured): a killed one started again has its counters as they were.
const PERSISTENT: [&str; 4] = ["--appendonly", "yes", "--appendfsync", "always"];

/// A primary's loss: when it was killed, and when the sentinels agreed on its replacement.
struct Loss {
    killed: Instant,
    replaced: Instant,
    port: u16,
}

/// Kills the primary under the traffic and waits until the sentinels name another.
async fn lose_the_primary(traffic: &Traffic, sentinels: &Arc<Mutex<Sentinels>>) -> Loss {
    let (loss, _) = traffic
        .during(sentinels.clone(), |sentinels| {
            let killed = Instant::now();
            let port = sentinels.kill_primary();
            sentinels.wait_for_failover(port);
            Loss {
                killed,
                replaced: Instant::now(),
                port,
            }
        })
        .await;
    loss
}

impl Loss {
    /// Whether `answer` was on its way while the primary was lost: answered after the kill,
    /// sent before the replacement plus [`MARGIN`].
    fn covers(&self, answer: &Answer) -> bool {
        self.killed <= answer.answered && answer.sent <= self.replaced + MARGIN
    }
}

/// No answer failed but those on their way while a primary was lost (from its kill until its
/// replacement plus [`MARGIN`]).
fn assert_failed_only_while_lost(answers: &[Answer], losses: &[Loss]) {
    let failed = (answers.iter()).filter(|answer| matches!(answer.outcome, Outcome::Failed(_)));
    let outside: Vec<&Answer> = failed
        .filter(|answer| !losses.iter().any(|loss| loss.covers(answer)))
        .collect();
    for loss in losses {
        let during: Vec<Answer> = (answers.iter())
            .filter(|answer| loss.covers(answer))
            .cloned()
            .collect();
        let last = (during.iter())
            .filter(|answer| matches!(answer.outcome, Outcome::Failed(_)))
            .map(|answer| answer.sent.saturating_duration_since(loss.killed))
            .max();
        eprintln!(
            "primary on port {} lost: replaced {:?} after the kill; {} failed of {}, the last \
             sent {last:?} after the kill {:?}",
            loss.port,
            loss.replaced - loss.killed,
            tally(&during).failed,
            during.len(),
            reasons(&during)
        );
    }
    assert!(
        outside.is_empty(),
        "{} answers failed outside a primary's loss and the {MARGIN:?} after it: {:?}",
        outside.len(),
        &outside[..outside.len().min(5)]
    );
}

/// The primary is killed; its replica takes over. The old primary starts again with the
/// counts it had (persisted), says it is a primary until the sentinels turn it into a replica
/// of the new one, and syncs. Then the new primary is killed, and the old one is promoted
/// again, with the counts it synced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_primary_returns_with_its_data_and_a_second_failover_promotes_it() {
    let sentinels = Sentinels::start_with(&PERSISTENT);
    let flags = sentinels.backend_flags();
    let sentinels = Arc::new(Mutex::new(sentinels));
    let traffic = Traffic::start(&flags.iter().map(String::as_str).collect::<Vec<_>>()).await;
    traffic.run_for_answers(2_000).await;

    let first = lose_the_primary(&traffic, &sentinels).await;
    traffic.run_for_answers(1_000).await;
    let old = first.port;
    let ((), returning) = traffic
        .during(sentinels.clone(), move |sentinels| {
            sentinels.start_again(old);
            sentinels.wait_for_replica(old);
        })
        .await;
    let returning = traffic.answers_in(returning);
    let cost = tally(&returning);
    eprintln!(
        "the old primary returned: {} failed of {} {:?}",
        cost.failed,
        cost.answers,
        reasons(&returning)
    );
    assert_eq!(
        cost.failed,
        0,
        "the old primary's return failed answers: {:?}",
        reasons(&returning)
    );

    let second = lose_the_primary(&traffic, &sentinels).await;
    assert_eq!(
        sentinels.lock().expect("not poisoned").primary().port(),
        old,
        "the second failover promoted the old primary"
    );
    traffic.run_for_answers(2_000).await;
    let answers = traffic.finish().await;

    let losses = [first, second];
    assert_failed_only_while_lost(&answers, &losses);
    // The generations live at a loss may admit what the replica had not received.
    let lossy: BTreeSet<usize> = (answers.iter())
        .filter(|answer| losses.iter().any(|loss| loss.covers(answer)))
        .map(|answer| answer.generation)
        .collect();
    assert_exact(
        &answers,
        |generation, _| {
            if lossy.contains(&generation) { 2 } else { 0 }
        },
    );
}
