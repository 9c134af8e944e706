//! Hot reload of the rules directory, through the real binary and real gRPC requests: edits
//! picked up on the timer, ConfigMap-style `..data` swaps, SIGHUP, and bad edits rejected
//! with the rules in force kept.

mod harness;
mod redis_harness;

use std::path::Path;
use std::time::{Duration, Instant};

use harness::{Floodgate, OK, OVER_LIMIT, costing, descriptor, request};
use redis_harness::RedisServer;

/// Short, so a change is seen within a fraction of a second.
const INTERVAL: [&str; 2] = ["--rules-reload-interval-ms", "100"];

/// How long a test waits for a reload before failing.
const DEADLINE: Duration = Duration::from_secs(10);

/// `api` with one fixed-window rule on `user`, `limit` per day: no roll-over during a test.
fn api_rules(limit: u32) -> String {
    format!(
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {{unit: day, requests_per_unit: {limit}}}\n"
    )
}

/// One hit on `user=alice`; its overall code.
async fn hit(server: &Floodgate) -> i32 {
    let response = server
        .ask(request("api", vec![descriptor(&[("user", "alice")])]))
        .await;
    response.overall_code
}

/// `user=alice`'s limit and remaining quota, looked at without counting a hit.
async fn quota(server: &Floodgate, domain: &str) -> Option<(u32, u32)> {
    let response = server
        .ask(request(domain, vec![costing("user", "alice", 0)]))
        .await;
    let status = &response.statuses[0];
    let limit = status.current_limit.as_ref()?;
    Some((limit.requests_per_unit, status.limit_remaining))
}

/// Waits until `user=alice`'s limit in `domain` is `limit`; returns the remaining quota.
async fn wait_for_limit(server: &Floodgate, domain: &str, limit: u32) -> u32 {
    let start = Instant::now();
    loop {
        if let Some((current, remaining)) = quota(server, domain).await
            && current == limit
        {
            return remaining;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "the limit did not become {limit}; stderr:\n{}",
            server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the server's log holds `text`.
async fn hits(server: &Floodgate, n: usize) -> Vec<i32> {
    let mut codes = Vec::with_capacity(n);
    for _ in 0..n {
        codes.push(hit(server).await);
    }
    codes
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).expect("writing a rule file");
}

#[tokio::test]
async fn a_changed_limit_applies_at_once_and_keeps_the_count() {
    let server = Floodgate::start(&[("api.yaml", &api_rules(5))], &INTERVAL);
    assert_eq!(hits(&server, 3).await, [OK; 3]);

    write(server.rules_dir.path(), "api.yaml", &api_rules(10));
    assert_eq!(wait_for_limit(&server, "api", 10).await, 7);
    assert_eq!(hits(&server, 7).await, [OK; 7]);
    assert_eq!(hit(&server).await, OVER_LIMIT);

    write(server.rules_dir.path(), "api.yaml", &api_rules(2));
    assert_eq!(wait_for_limit(&server, "api", 2).await, 0);
    assert_eq!(hit(&server).await, OVER_LIMIT);
    // The rule's metrics outlive its reloads too: one rejection under each limit.
    assert_eq!(
        sample(
            &server,
            "ratelimit_service_rate_limit_over_limit{domain=\"api\",key1=\"user\"}"
        ),
        2
    );
}

#[tokio::test]
async fn a_new_rule_file_adds_its_domain() {
    let server = Floodgate::start_with_env(
        &[("api.yaml", &api_rules(5))],
        &INTERVAL,
        &[("RUST_LOG", "info"), ("NO_COLOR", "1")],
    );
    assert_eq!(quota(&server, "web").await, None);

    let web = api_rules(4).replace("domain: api", "domain: web");
    write(server.rules_dir.path(), "web.yaml", &web);
    assert_eq!(wait_for_limit(&server, "web", 4).await, 4);
    assert_eq!(quota(&server, "api").await, Some((5, 5)));
    let log = server.wait_for_log("rules reloaded");
    assert!(log.contains("domains=2 rules=2"), "{log}");
}

#[tokio::test]
async fn a_bad_change_is_rejected_and_the_old_rules_keep_counting() {
    let server = Floodgate::start(&[("api.yaml", &api_rules(5))], &INTERVAL);
    assert_eq!(hit(&server).await, OK);

    let bad = api_rules(5).replace("requests_per_unit: 5", "requests_per_unit: lots");
    write(server.rules_dir.path(), "api.yaml", &bad);
    let file = server.rules_dir.path().join("api.yaml");
    let log = server.wait_for_log("rules not reloaded");
    let named = format!(
        "{}:4: domain api > user: rate_limit.requests_per_unit",
        file.display()
    );
    assert!(log.contains(&named), "{log}");

    assert_eq!(hits(&server, 4).await, [OK; 4]);
    assert_eq!(hit(&server).await, OVER_LIMIT);
    assert_eq!(
        config_loads(&server),
        (1, 1),
        "the start-up load, then the rejected one"
    );

    write(server.rules_dir.path(), "api.yaml", &api_rules(8));
    assert_eq!(wait_for_limit(&server, "api", 8).await, 3);
    let log = server.stderr();
    assert_eq!(log.matches("rules not reloaded").count(), 1, "{log}");
    assert_eq!(config_loads(&server), (2, 1));
}

#[tokio::test]
async fn a_rule_file_replaced_by_a_dangling_link_is_rejected_and_its_domain_kept() {
    let server = Floodgate::start(&[("api.yaml", &api_rules(5))], &INTERVAL);
    assert_eq!(hit(&server).await, OK);
    let file = server.rules_dir.path().join("api.yaml");
    std::fs::remove_file(&file).expect("remove the rule file");
    std::os::unix::fs::symlink(server.rules_dir.path().join("gone.yaml"), &file)
        .expect("a dangling link in its place");
    let log = server.wait_for_log("rules not reloaded");
    assert!(
        log.contains(&format!("{}", file.display())) && log.contains("cannot read the rule file"),
        "{log}"
    );
    // The domain is still limited, on the count it had.
    assert_eq!(hits(&server, 4).await, [OK; 4]);
    assert_eq!(hit(&server).await, OVER_LIMIT);
}

#[tokio::test]
async fn a_rule_file_nested_too_deep_or_too_big_is_rejected_and_the_server_lives_on() {
    let server = Floodgate::start_with_env(
        &[("api.yaml", &api_rules(5))],
        &INTERVAL,
        &[("FLOODGATE_RULES_MAX_BYTES", "4096")],
    );
    assert_eq!(hit(&server).await, OK);
    let file = server.rules_dir.path().join("api.yaml");

    // `- - - - …`: 3,000 levels of lists in 6 KB, once a stack overflow that aborted every
    // replica mounting the file.
    let deep = format!("{}metadata:\n{}x\n", api_rules(5), "- ".repeat(3_000));
    write(server.rules_dir.path(), "api.yaml", &deep[..4000]);
    let log = server.wait_for_log("rules not reloaded");
    assert!(
        log.contains(&format!(
            "{}:6: (file): invalid YAML: nested 101 levels",
            file.display()
        )),
        "{log}"
    );

    write(server.rules_dir.path(), "api.yaml", &deep);
    let log = server.wait_for_log_count("rules not reloaded", 2);
    assert!(log.contains("above rules_max_bytes (4096)"), "{log}");

    // Alive, and still on the rules it had.
    assert_eq!(hits(&server, 4).await, [OK; 4]);
    assert_eq!(hit(&server).await, OVER_LIMIT);
    assert_eq!(config_loads(&server), (1, 2));
}

/// `ratelimit_service_config_load_success` and `_error` from `/metrics`.
fn config_loads(server: &Floodgate) -> (u64, u64) {
    (
        sample(server, "ratelimit_service_config_load_success"),
        sample(server, "ratelimit_service_config_load_error"),
    )
}

/// The value of the sample `series` (name and labels as printed) on `/metrics`.
fn sample(server: &Floodgate, series: &str) -> u64 {
    let (status, page) = server.http("GET", "/metrics", "");
    assert_eq!(status, 200, "{page}");
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} sample in\n{page}"))
}

/// On Redis an exhausted counter is remembered locally until its reset; a raised limit must
/// not wait for that.
#[tokio::test]
async fn a_raised_limit_lifts_a_rejection_the_redis_backend_remembered() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut flags = vec!["--backend", "redis", "--redis-url", &url];
    flags.extend(INTERVAL);
    let server = Floodgate::start_with_env(
        &[("api.yaml", &api_rules(2))],
        &flags,
        &[("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "1000")],
    );
    assert_eq!(hits(&server, 3).await, [OK, OK, OVER_LIMIT]);

    write(server.rules_dir.path(), "api.yaml", &api_rules(4));
    assert_eq!(wait_for_limit(&server, "api", 4).await, 2);
    assert_eq!(hits(&server, 3).await, [OK, OK, OVER_LIMIT]);
}

/// The layout kubelet gives a ConfigMap volume, and its update: the files are symbolic links
/// through `..data`, which points at a timestamped directory; an update writes a new
/// directory, then renames a new `..data` link over the old one and removes the old data.
#[cfg(unix)]
#[tokio::test]
async fn a_configmap_update_is_picked_up() {
    use std::os::unix::fs::symlink;

    let server = Floodgate::start(&[], &INTERVAL);
    let volume = server.rules_dir.path();
    let publish = |timestamp: &str, limit: u32| {
        let data = volume.join(timestamp);
        std::fs::create_dir(&data).expect("mkdir");
        write(&data, "api.yaml", &api_rules(limit));
        symlink(timestamp, volume.join("..data_tmp")).expect("symlink");
        std::fs::rename(volume.join("..data_tmp"), volume.join("..data")).expect("swap");
    };
    publish("..2026_11_22_10_00_00.000000001", 5);
    symlink("..data/api.yaml", volume.join("api.yaml")).expect("symlink");
    assert_eq!(wait_for_limit(&server, "api", 5).await, 5);
    assert_eq!(hits(&server, 3).await, [OK; 3]);

    publish("..2026_11_22_10_05_00.000000002", 10);
    std::fs::remove_dir_all(volume.join("..2026_11_22_10_00_00.000000001")).expect("cleanup");
    assert_eq!(wait_for_limit(&server, "api", 10).await, 7);
}

#[cfg(unix)]
#[tokio::test]
async fn sighup_reloads_when_the_timer_is_off() {
    let server = Floodgate::start_with_env(
        &[("api.yaml", &api_rules(5))],
        &["--rules-reload-interval-ms", "0"],
        &[("RUST_LOG", "info")],
    );
    assert_eq!(hits(&server, 2).await, [OK; 2]);
    write(server.rules_dir.path(), "api.yaml", &api_rules(10));
    // With the timer off nothing looks at the directory: a few of the test intervals later
    // the old limit is still in force.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(quota(&server, "api").await, Some((5, 3)));

    let sent = std::process::Command::new("kill")
        .args(["-HUP", &server.pid().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    assert_eq!(wait_for_limit(&server, "api", 10).await, 8);
    server.wait_for_log("SIGHUP: reloading the rules");

    // Off the runtime, so the test's closing connections can finish while it waits.
    let (status, log) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .expect("terminating");
    assert!(status.success(), "SIGTERM still shuts down cleanly: {log}");
}

/// With `merge_domain_config` (upstream's `MERGE_DOMAIN_CONFIG`), two files of one domain
/// add up, at start and on every reload.
#[tokio::test]
async fn merged_files_of_one_domain_decide_together_and_reload_together() {
    let paths = "domain: api\ndescriptors:\n  - key: path\n    rate_limit: {unit: day, requests_per_unit: 3}\n";
    let server = Floodgate::start_with_env(
        &[("api.yaml", &api_rules(5)), ("paths.yaml", paths)],
        &INTERVAL,
        &[("FLOODGATE_MERGE_DOMAIN_CONFIG", "true")],
    );
    assert_eq!(quota(&server, "api").await, Some((5, 5)));
    let path = server
        .ask(request("api", vec![descriptor(&[("path", "/v1")])]))
        .await;
    assert_eq!(path.statuses[0].limit_remaining, 2, "{path:?}");

    write(server.rules_dir.path(), "api.yaml", &api_rules(8));
    assert_eq!(wait_for_limit(&server, "api", 8).await, 8);
    let path = server
        .ask(request("api", vec![descriptor(&[("path", "/v1")])]))
        .await;
    assert_eq!(
        path.statuses[0].limit_remaining, 1,
        "the other file's rule stays"
    );
}
