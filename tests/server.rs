//! The server around the decision: HTTP endpoints, gRPC health and reflection, and shutdown.

mod harness;

use std::time::Duration;

use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use harness::{Floodgate, descriptor, request};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const RULES: &str = "
domain: api
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 1
";

async fn channel(server: &Floodgate) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

const JSON_REQUEST: &str =
    r#"{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}"#;

#[test]
fn json_endpoint_answers_200_then_429() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let (status, body) = server.http("POST", "/json", JSON_REQUEST);
    assert_eq!(status, 200, "{body}");
    let response: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(response["overallCode"], "OK");
    assert_eq!(
        response["statuses"][0]["currentLimit"]["requestsPerUnit"],
        1
    );
    let (status, body) = server.http("POST", "/json", JSON_REQUEST);
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("OVER_LIMIT"), "{body}");
}

#[test]
fn json_endpoint_accepts_snake_case_field_names() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let body = r#"{"domain":"api","hits_addend":1,"descriptors":[{"entries":[{"key":"user","value":"b"}]}]}"#;
    assert_eq!(server.http("POST", "/json", body).0, 200);
}

#[test]
fn json_endpoint_answers_400_with_the_reason() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let (status, body) = server.http("POST", "/json", "{not json");
    assert_eq!(status, 400);
    assert!(body.contains("invalid JSON"), "{body}");
    let (status, body) = server.http("POST", "/json", r#"{"domain":"","descriptors":[]}"#);
    assert_eq!(status, 400);
    assert!(body.contains("domain must not be empty"), "{body}");
}

#[test]
fn json_endpoint_names_an_unsigned_field_that_holds_something_else() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let entries = r#""entries":[{"key":"user","value":"a"}]"#;
    let cases = [
        (
            format!(r#"{{"domain":"api","descriptors":[{{{entries}}}],"hitsAddend":-3}}"#),
            "hitsAddend must be a non-negative integer, got -3",
        ),
        (
            format!(
                r#"{{"domain":"api","descriptors":[{{{entries}}},{{{entries},"hitsAddend":"x"}}]}}"#
            ),
            "descriptors[1].hitsAddend must be a non-negative integer, got",
        ),
        (
            format!(
                r#"{{"domain":"api","descriptors":[{{{entries},"limit":{{"requestsPerUnit":1.5,"unit":"SECOND"}}}}]}}"#
            ),
            "descriptors[0].limit.requestsPerUnit must be a non-negative integer, got 1.5",
        ),
    ];
    for (body, expected) in cases {
        let (status, answer) = server.http("POST", "/json", &body);
        assert_eq!(status, 400, "{body}");
        assert!(answer.contains(expected), "{body}: {answer}");
    }
}

#[test]
fn health_and_readiness_answer_while_serving() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    assert_eq!(server.http("GET", "/healthz", "").0, 200);
    assert_eq!(server.http("GET", "/readyz", "").0, 200);
}

#[test]
fn rlconfig_lists_the_loaded_rules() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let (status, body) = server.http("GET", "/rlconfig", "");
    assert_eq!(status, 200);
    assert!(body.contains("api.user"), "{body}");
}

#[tokio::test]
async fn grpc_health_reports_the_rate_limit_service_serving() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let mut health = HealthClient::new(channel(&server).await);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "service {service:?}");
    }
}

/// Reflection's services in one version of its protocol, as `$version`'s client lists them.
macro_rules! reflected_services {
    ($version:ident, $server:expr) => {{
        use tonic_reflection::pb::$version::ServerReflectionRequest;
        use tonic_reflection::pb::$version::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::$version::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::$version::server_reflection_response::MessageResponse;

        let mut client = ServerReflectionClient::new(channel($server).await);
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut responses = client
            .server_reflection_info(tokio_stream::iter([request]))
            .await
            .unwrap()
            .into_inner();
        let response = responses.message().await.unwrap().unwrap();
        let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
            panic!("unexpected reflection answer");
        };
        list.service
            .into_iter()
            .map(|s| s.name)
            .collect::<Vec<String>>()
    }};
}

/// Both reflection versions, as upstream's grpc-go serves them: grpcio-reflection's client
/// and several GUI clients speak only v1alpha.
#[tokio::test]
async fn grpc_reflection_v1alpha_lists_the_rate_limit_service() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let names = reflected_services!(v1alpha, &server);
    assert!(
        names.contains(&"envoy.service.ratelimit.v3.RateLimitService".to_string()),
        "{names:?}"
    );
}

#[tokio::test]
async fn grpc_reflection_lists_the_rate_limit_service() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let names = reflected_services!(v1, &server);
    assert!(
        names.contains(&"envoy.service.ratelimit.v3.RateLimitService".to_string()),
        "{names:?}"
    );
}

#[tokio::test]
async fn sigterm_finishes_and_exits_cleanly() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    client
        .should_rate_limit(request("api", vec![descriptor(&[("user", "z")])]))
        .await
        .unwrap();
    let (status, stderr) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}\n{stderr}");
}

#[tokio::test]
async fn sigterm_turns_health_not_serving_before_exit() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let mut health = HealthClient::new(channel(&server).await);
    let mut updates = health
        .watch(HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = updates.message().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);
    let pid = server.pid().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let next = updates.message().await.unwrap().unwrap();
    assert_eq!(next.status, ServingStatus::NotServing as i32);
    drop(updates);
    drop(health);
    let (status, stderr) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}\n{stderr}");
}

#[tokio::test]
async fn settings_come_from_floodgate_environment_variables() {
    let server = Floodgate::start_with_env(
        &[("r.yaml", RULES)],
        &[],
        &[
            ("FLOODGATE_RESPONSE_HEADERS", "ietf"),
            ("FLOODGATE_SHADOW_MODE", "true"),
        ],
    );
    let req = request("api", vec![descriptor(&[("user", "env")])]);
    let mut client = RateLimitServiceClient::new(channel(&server).await);
    client.should_rate_limit(req.clone()).await.unwrap();
    let over = client.should_rate_limit(req).await.unwrap().into_inner();
    assert_eq!(over.statuses[0].code, 2, "the descriptor is over its limit");
    assert_eq!(
        over.overall_code, 1,
        "global shadow mode answers OK overall"
    );
    assert!(
        over.response_headers_to_add
            .iter()
            .any(|h| h.key == "ratelimit-policy")
    );
}

#[test]
fn json_log_format_writes_one_json_object_per_line() {
    let server = Floodgate::start_with_env(
        &[("r.yaml", RULES)],
        &["--log-format", "json"],
        &[("RUST_LOG", "info")],
    );
    let (status, stderr) = server.terminate();
    assert!(status.success());
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.is_empty()).collect();
    assert!(!lines.is_empty(), "no log lines");
    for line in lines {
        let entry: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(entry["level"].is_string(), "{line}");
    }
}

#[test]
fn query_command_prints_the_decision_and_exits_3_over_limit_unlike_a_usage_error() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let query = || {
        harness::command()
            .args(["query", "--addr", &format!("http://{}", server.grpc_addr)])
            .args(["--domain", "api", "--descriptor", "user=q"])
            .output()
            .unwrap()
    };
    let first = query();
    let text = String::from_utf8_lossy(&first.stdout);
    assert_eq!(first.status.code(), Some(0), "{text}");
    assert!(
        text.starts_with("OK\n") && text.contains("limit 1 per day"),
        "{text}"
    );
    let second = query();
    assert_eq!(second.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&second.stdout).starts_with("OVER_LIMIT"));
    let misspelt = harness::command()
        .args(["query", "--domian", "api"])
        .output()
        .unwrap();
    assert_eq!(misspelt.status.code(), Some(2), "clap's usage error");
    let unreachable = harness::command()
        .args(["query", "--addr", "http://127.0.0.1:1", "--domain", "api"])
        .args(["--descriptor", "user=q"])
        .output()
        .unwrap();
    assert_eq!(unreachable.status.code(), Some(1), "no decision");
}

#[test]
fn version_names_the_commit_built() {
    let output = harness::command()
        .arg("--version")
        .output()
        .expect("floodgate runs");
    let (version, commit) = harness::built_version();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        format!("floodgate {version} ({commit})")
    );
}

#[test]
fn bash_completes_subcommands_and_flags_from_the_generated_script() {
    let script = harness::command()
        .args(["completions", "bash"])
        .output()
        .expect("floodgate runs");
    assert!(script.status.success());
    let dir = tempfile::tempdir().expect("a directory");
    let path = dir.path().join("floodgate.bash");
    std::fs::write(&path, &script.stdout).expect("the script");
    // What bash does on <TAB>: the completion function fills COMPREPLY for the words typed.
    let complete = |words: &str, current: usize| {
        let program = format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD={current}; \
             COMP_LINE=\"${{COMP_WORDS[*]}}\"; COMP_POINT=${{#COMP_LINE}}; \
             _floodgate floodgate \"${{COMP_WORDS[$COMP_CWORD]}}\" \"${{COMP_WORDS[$COMP_CWORD-1]}}\"; \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            path.display()
        );
        let output = std::process::Command::new("bash")
            .args(["-c", &program])
            .output()
            .expect("bash runs");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let subcommands = complete("floodgate q", 1);
    assert_eq!(subcommands.trim(), "query", "{subcommands}");
    let flags = complete("floodgate query --dom", 2);
    assert_eq!(flags.trim(), "--domain", "{flags}");
}

/// A gRPC request whose caller's deadline (80% of its `grpc-timeout`) has passed by the time
/// its body arrives is refused DEADLINE_EXCEEDED without work: nothing is counted, and the
/// answer is in `floodgate_requests_total`. A bare HTTP/2 client holds the body back, which
/// no gRPC client does; tonic's own enforcement of the timeout (at 100%) would answer
/// CANCELLED, later.
#[tokio::test]
async fn a_request_past_its_callers_deadline_is_refused_and_counts_nothing() {
    let server = Floodgate::start(&[("api.yaml", RULES)], &[]);
    let mut call = harness::raw_call(server.grpc_addr, &[("grpc-timeout", "1000m")]).await;
    // Past 800 ms (the deadline floodgate keeps), before 1,000 ms (the call's own bound).
    tokio::time::sleep(Duration::from_millis(880)).await;
    let message = request("api", vec![descriptor(&[("user", "late")])]);
    (call.body)
        .send_data(harness::grpc_frame(&message), true)
        .expect("the body");
    let status = tokio::time::timeout(
        Duration::from_secs(5),
        harness::grpc_status(&mut call.response),
    )
    .await
    .expect("an answer");
    let deadline_exceeded = (tonic::Code::DeadlineExceeded as i32).to_string();
    assert_eq!(status, Some(deadline_exceeded));

    let refused = "floodgate_requests_total{protocol=\"grpc\",method=\"ShouldRateLimit\",\
                   code=\"DEADLINE_EXCEEDED\"}";
    assert_eq!(server.metric(refused), 1.0);
    // The day's one request for this user is still there.
    let mut client = RateLimitServiceClient::new(channel(&server).await);
    let again = request("api", vec![descriptor(&[("user", "late")])]);
    let answer = client.should_rate_limit(again).await.expect("an answer");
    assert_eq!(answer.get_ref().overall_code, harness::OK);
}

/// The start-up banner's suggested query works as printed, on a Unix socket too (where an
/// `http://` address would not).
#[test]
fn the_banners_query_works_as_printed_on_a_unix_socket() {
    let dir = tempfile::tempdir().expect("a directory for the socket");
    let socket = dir.path().join("floodgate.sock");
    let demo = "domain: floodgate_demo\ndescriptors:\n  - key: user_id\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let rules = harness::write_rules(&[("demo.yaml", demo)]);
    let mut serve = harness::command();
    serve
        .args(["serve", "--http-addr", "127.0.0.1:0", "--rules"])
        .arg(rules.path())
        .env("FLOODGATE_GRPC_UNIX_SOCKET", &socket);
    let answer = banner_tried(serve);
    assert!(
        answer.contains("user_id=example: OK, limit 5 per minute"),
        "{answer}"
    );
}

/// Starts `serve` and runs the query its banner suggests while it serves: the query's
/// output, or the banner's line when it suggests none.
fn banner_tried(mut serve: std::process::Command) -> String {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let mut child = serve
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("floodgate starts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let _listening = lines.next().expect("the listening line").expect("text");
    let suggestion = lines.next().expect("the suggestion").expect("text");
    let tried = suggestion.strip_prefix("try: floodgate ").map(|command| {
        let answer = harness::command()
            .args(command.split_whitespace())
            .output()
            .expect("floodgate query runs");
        assert!(
            answer.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&answer.stderr)
        );
        String::from_utf8_lossy(&answer.stdout).into_owned()
    });
    let _ = child.kill();
    let _ = child.wait();
    tried.unwrap_or(suggestion)
}

/// `serve --help` names every setting of the settings table (docs/settings.md): as a flag,
/// or in its list of the settings that have none (so TLS and xDS are found without reading
/// the code).
#[test]
fn serve_help_names_every_setting() {
    let help = harness::command()
        .args(["serve", "--help"])
        .output()
        .expect("floodgate runs");
    let help = String::from_utf8(help.stdout).expect("text");
    let page = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/settings.md");
    let page = std::fs::read_to_string(page).expect("the settings page");
    // The settings table: from its header to the first line that is not a row.
    let rows: Vec<&str> = (page.lines())
        .skip_while(|line| *line != "| key | default | meaning |")
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .collect();
    assert!(
        rows.len() > 50,
        "the settings table has {} rows",
        rows.len()
    );
    let mut missing = Vec::new();
    for row in rows {
        let Some(first) = row.split('|').nth(1) else {
            continue;
        };
        for key in first.split('`').skip(1).step_by(2) {
            // A section's key is named by the section (`connection_limits.*`) or in full.
            let section = key.split('.').next().unwrap_or(key);
            let flag = format!("--{}", key.replace('_', "-"));
            let named = help.contains(&flag)
                || help.contains(key)
                || help.contains(&format!("{section}.*"))
                || help.contains(&format!("{section}.{{"));
            if !named {
                missing.push(key.to_owned());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not in serve --help: {missing:?}\n{help}"
    );
}

/// [`banner_tried`] for a server on `rules`.
fn banner(rules: &[(&str, &str)]) -> String {
    let rules = harness::write_rules(rules);
    let mut serve = harness::command();
    serve
        .args(harness::SERVE_ANYWHERE)
        .arg("--rules")
        .arg(rules.path());
    banner_tried(serve)
}

/// The banner suggests a request the loaded rules decide: their first rule's domain and
/// path, a wildcard filled in; with no rule loaded, it says so instead.
#[test]
fn the_banner_suggests_a_request_the_loaded_rules_decide() {
    let shop = "
domain: shop
descriptors:
  - key: tenant
    value: acme
    descriptors:
      - key: path
        value: /api/*
        rate_limit: {unit: minute, requests_per_unit: 7}
";
    let decided = banner(&[("shop.yaml", shop)]);
    assert!(
        decided.contains("tenant=acme,path=/api/example: OK, limit 7 per minute"),
        "{decided}"
    );
    let nothing = banner(&[]);
    assert_eq!(nothing, "no rule is loaded yet: nothing to try");
}
