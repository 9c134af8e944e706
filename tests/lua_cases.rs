//! Drives the shared table of algorithm cases through the Lua scripts on a real
//! `redis-server`: the same expectations the memory backend meets (`tests/algorithms.rs`).

mod common;
mod lua_support;
mod redis_harness;

use common::cases::{Case, cases};
use deadpool_redis::redis;
use floodgate::backend::redis::script::Scripts;
use floodgate::limiter::CounterKey;
use redis_harness::RedisServer;

#[tokio::test]
async fn every_case_holds_on_the_lua_scripts() {
    let server = RedisServer::start();
    let mut connection = server.connection().await;
    let scripts = Scripts::new();
    lua_support::load(&mut connection, &scripts).await;
    let mut failures = Vec::new();
    for case in cases() {
        failures.extend(run(&mut connection, &scripts, &case).await);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Runs one case on its own fresh key; returns a line per step that differs.
async fn run(
    connection: &mut redis::aio::MultiplexedConnection,
    scripts: &Scripts,
    case: &Case,
) -> Vec<String> {
    let key = CounterKey::new("lua-cases", &case.name, 0, &case.limit, []);
    let mut failures = Vec::new();
    for (index, step) in case.steps.iter().enumerate() {
        let got = lua_support::hit(
            connection,
            scripts,
            key.as_str(),
            &case.limit,
            step.hits,
            step.at_micros,
        )
        .await;
        if got.as_ref() != Ok(&step.expect) {
            failures.push(format!(
                "{} step {index} ({:?} at {}): expected {:?}, got {:?}",
                case.name, step.hits, step.at_micros, step.expect, got
            ));
        }
    }
    failures
}
