//! A Redis Cluster in motion: the changes operators make as routine (resharding, failovers, a
//! node added and one removed, a rolling restart of every node) and the loss of a primary,
//! each made while clients of two floodgate servers hammer many counters of every algorithm.
//!
//! What is asserted, per change: how many answers failed, and that every counter admitted
//! exactly its limit (a graceful change loses nothing) or at most two more (a `SIGKILL`: the
//! writes its replica had not received are lost with it). For the loss of a primary: that the
//! counters living on the other primaries lose nothing at all, and that those on the lost one
//! fail only until the cluster is whole again plus the promised margin (docs/redis.md).
//!
//! The traffic and its counting are `motion/mod.rs`'s.

mod harness;
mod motion;
mod redis_harness;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use harness::ALGORITHMS;
use motion::{Answer, Counter, MARGIN, Outcome, Traffic, assert_exact, reasons, tally, value};
use redis_harness::cluster::{Failover, Node, RedisCluster};

/// The primary each counter of `generations` lives on now (by its keys).
fn homes(cluster: &RedisCluster, answers: &[Answer]) -> BTreeMap<(usize, Counter), Node> {
    let wanted: BTreeSet<(usize, Counter)> = (answers.iter())
        .map(|answer| (answer.generation, answer.counter))
        .collect();
    let mut by_tag = BTreeMap::new();
    for primary in cluster.primaries() {
        for key in cluster.keys(primary) {
            by_tag.insert(key, primary);
        }
    }
    let mut homes = BTreeMap::new();
    for (generation, counter) in wanted {
        let needle = format!("{}={}}}", ALGORITHMS[counter.0], value(generation, counter));
        if let Some((_, &node)) = by_tag.iter().find(|(key, _)| key.contains(&needle)) {
            homes.insert((generation, counter), node);
        }
    }
    homes
}

/// The loss of a primary (its replica took over as `replacement`, the cluster whole at
/// `whole`): of the answers that came after the kill, nothing failed on the other primaries
/// and nothing on the lost one sent more than [`MARGIN`] after `whole`; and no counter
/// admitted more than its limit, but those on the lost primary and those of the `lossy`
/// generations (live during a forced failover), 2 more. (Failures before the kill belong to
/// the changes made before it, which the callers tally.)
fn assert_lost_only_its_own(
    cluster: &RedisCluster,
    answers: &[Answer],
    (replacement, killed, whole): (Node, Instant, Instant),
    lossy: &BTreeSet<usize>,
) {
    let homes = homes(cluster, answers);
    let failures = (answers.iter())
        .filter(|answer| answer.answered >= killed && matches!(answer.outcome, Outcome::Failed(_)));
    let mut elsewhere = Vec::new();
    let mut late = Vec::new();
    let mut on_lost = 0;
    for answer in failures {
        let home = homes.get(&(answer.generation, answer.counter)).copied();
        if home != Some(replacement) {
            elsewhere.push((home, answer.clone()));
        } else if answer.sent > whole + MARGIN {
            late.push(answer.clone());
        } else {
            on_lost += 1;
        }
    }
    let last = (answers.iter())
        .filter(|answer| answer.answered >= killed)
        .filter(|answer| matches!(answer.outcome, Outcome::Failed(_)))
        .map(|answer| answer.sent)
        .max();
    eprintln!(
        "primary lost: the cluster whole {:?} after the kill; {on_lost} failed answers, all \
         on its counters, the last sent {:?} after the kill",
        whole - killed,
        last.map(|last| last.saturating_duration_since(killed))
    );
    assert!(
        elsewhere.is_empty(),
        "{} answers failed for counters on healthy primaries: {:?}",
        elsewhere.len(),
        &elsewhere[..elsewhere.len().min(5)]
    );
    assert!(
        late.is_empty(),
        "{} answers failed that were sent more than {MARGIN:?} after the cluster was whole \
         again ({:?} after the kill): {:?}",
        late.len(),
        whole - killed,
        &late[..late.len().min(5)]
    );
    assert_exact(answers, |generation, counter| {
        let on_lost = homes.get(&(generation, counter)) == Some(&replacement);
        if on_lost || lossy.contains(&generation) {
            2
        } else {
            0
        }
    });
}

/// A new cluster, shared with the changes made to it, and its seeds.
fn started_cluster() -> (Arc<Mutex<RedisCluster>>, String) {
    let cluster = RedisCluster::start();
    let seeds = cluster.seeds();
    (Arc::new(Mutex::new(cluster)), seeds)
}

/// Two floodgate servers on the cluster of `seeds`, and their clients.
async fn traffic_on(seeds: &str) -> Traffic {
    Traffic::start(&["--backend", "redis-cluster", "--redis-url", seeds]).await
}

/// A change an operator makes, run by the harness.
type Change = Box<dyn FnOnce(&mut RedisCluster) + Send>;

/// Kills a primary under the traffic and waits for its replica to take over; the replacement,
/// when the primary was killed and when the cluster was whole again.
async fn kill_a_primary(
    traffic: &Traffic,
    cluster: &Arc<Mutex<RedisCluster>>,
) -> (Node, Instant, Instant) {
    let ((replacement, killed, whole), _) = traffic
        .during(cluster.clone(), |cluster| {
            // One with a single replica, so the one that takes over is known.
            let primary = (cluster.primaries().into_iter())
                .find(|&primary| cluster.replicas_of(primary).len() == 1)
                .expect("a primary with one replica");
            let replica = cluster.replica_of(primary);
            let killed = Instant::now();
            cluster.kill(primary);
            let replacement = cluster.wait_for_failover(primary, replica);
            (replacement, killed, Instant::now())
        })
        .await;
    (replacement, killed, whole)
}

/// The cluster has not changed since it was created; one of its three primaries is
/// `SIGKILL`ed under load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_primary_fails_only_the_hits_of_its_own_slots() {
    let (cluster, seeds) = started_cluster();
    let traffic = traffic_on(&seeds).await;
    traffic.run_for_answers(3_000).await;
    let loss = kill_a_primary(&traffic, &cluster).await;
    traffic.run_for_answers(3_000).await;
    let answers = traffic.finish().await;
    let cluster = cluster.lock().expect("not poisoned");
    assert_lost_only_its_own(&cluster, &answers, loss, &BTreeSet::new());
}

/// The highest slot: the reshard below moves the lowest ones, so its shard is untouched.
const LAST_SLOT: u16 = 16_383;

/// Routine changes, one after another under load: resharding, a graceful failover and a
/// forced one, a primary added and the slots rebalanced onto it, a primary removed. Each fails
/// at most 1% of the answers sent meanwhile and loses nothing (counts exact), but the forced
/// failover, which may lose the writes its replica had not received (2 per counter at most). Then, on the
/// cluster these changes left, a primary is `SIGKILL`ed: it costs what it costs on a cluster
/// that never changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routine_changes_lose_nothing_and_leave_a_cluster_that_fails_over_as_a_new_one() {
    let (cluster, seeds) = started_cluster();
    let traffic = traffic_on(&seeds).await;
    traffic.run_for_answers(2_000).await;
    let mut tallies = Vec::new();
    // Whether each change may lose the writes a replica had not received (a forced failover).
    let changes: Vec<(&str, bool, Change)> = vec![
        (
            "reshard 4,000 slots",
            false,
            Box::new(|cluster: &mut RedisCluster| {
                let primaries = cluster.primaries();
                cluster.reshard(primaries[0], primaries[1], 4_000);
            }),
        ),
        // Both failovers on the shard the reshard left alone (the top slot's): Redis 7.0.15
        // once promoted the replica of the reshard's target claiming one slot fewer than its
        // primary had served (its copy of the primary's slots had missed the last one moved,
        // though every node's CLUSTER NODES agreed), and that cluster never settled. That is
        // Redis' to fix; floodgate's part, decisions through a failover, is the same on any
        // shard.
        (
            "CLUSTER FAILOVER",
            false,
            Box::new(|cluster: &mut RedisCluster| {
                let replica = cluster.replica_of(cluster.primary_of(LAST_SLOT));
                cluster.failover(replica, Failover::Graceful);
            }),
        ),
        (
            "CLUSTER FAILOVER FORCE",
            true,
            Box::new(|cluster: &mut RedisCluster| {
                let replica = cluster.replica_of(cluster.primary_of(LAST_SLOT));
                cluster.failover(replica, Failover::Force);
            }),
        ),
        (
            "a primary added, the slots rebalanced",
            false,
            Box::new(|cluster: &mut RedisCluster| {
                let primary = cluster.add_primary();
                cluster.add_replica(primary);
                cluster.rebalance();
            }),
        ),
        (
            "a primary removed (its slots moved off, del-node)",
            false,
            Box::new(|cluster: &mut RedisCluster| {
                let primary = cluster.primaries()[0];
                cluster.remove(primary);
            }),
        ),
    ];
    let mut lossy = BTreeSet::new();
    for (name, loses_unreplicated, change) in changes {
        let ((), during) = traffic.during(cluster.clone(), change).await;
        traffic.run_for_answers(500).await;
        let answers = traffic.answers_in(during);
        if loses_unreplicated {
            lossy.extend(answers.iter().map(|answer| answer.generation));
        }
        let tally = tally(&answers);
        eprintln!(
            "{name}: {} failed of {} {:?}",
            tally.failed,
            tally.answers,
            reasons(&answers)
        );
        tallies.push((name, tally));
    }
    let loss = kill_a_primary(&traffic, &cluster).await;
    traffic.run_for_answers(3_000).await;
    let answers = traffic.finish().await;
    for (name, tally) in &tallies {
        assert!(
            tally.failed * 100 <= tally.answers,
            "{name}: {} of {} answers failed",
            tally.failed,
            tally.answers
        );
    }
    let cluster = cluster.lock().expect("not poisoned");
    // The graceful changes' generations are exact; the forced failover's and the kill's allow
    // their lost writes.
    assert_lost_only_its_own(&cluster, &answers, loss, &lossy);
}

/// An upgrade's rolling restart of all six nodes under load (each replica restarted, then each
/// primary failed over to its replica and restarted): of the answers sent from its start until
/// 1,000 after its end, at most 0.1% fail, and every count is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_every_node_fails_almost_nothing_and_counts_exactly() {
    let (cluster, seeds) = started_cluster();
    let traffic = traffic_on(&seeds).await;
    traffic.run_for_answers(2_000).await;
    let ((), during) = traffic
        .during(cluster.clone(), RedisCluster::rolling_restart)
        .await;
    traffic.run_for_answers(1_000).await;
    let meanwhile = traffic.answers_in(during.start..traffic.answered());
    let cost = tally(&meanwhile);
    eprintln!(
        "rolling restart: {} failed of {} {:?}",
        cost.failed,
        cost.answers,
        reasons(&meanwhile)
    );
    assert!(
        cost.failed * 1_000 <= cost.answers,
        "{} of {} answers failed: {:?}",
        cost.failed,
        cost.answers,
        (meanwhile.iter())
            .filter(|answer| matches!(answer.outcome, Outcome::Failed(_)))
            .take(5)
            .collect::<Vec<_>>()
    );
    let answers = traffic.finish().await;
    assert_exact(&answers, |_, _| 0);
}
