//! The admin API against the real binary: reading a descriptor's counters without counting,
//! resetting them (on memory, and on a real Redis, where the replica's over-limit cache must
//! forget them too), refusing every request without the token, and mutual TLS standing in
//! for the token or beside it.

mod harness;
mod redis_harness;

// The certificate generator, as the Redis harness includes it.
use redis_harness::tls::{Certificates, Pair};

use harness::{Floodgate, OK, OVER_LIMIT, descriptor, http_with, request};
use redis_harness::RedisServer;

const RULES: &str = "
domain: admin
descriptors:
  - key: user
    rate_limits:
      - {unit: hour, requests_per_unit: 3, name: hourly}
      - {unit: day, requests_per_unit: 10, algorithm: sliding_log, name: daily}
";

const TOKEN: &str = "0123-admin-token";

fn start(flags: &[&str]) -> Floodgate {
    Floodgate::start_with_env(
        &[("admin.yaml", RULES)],
        flags,
        &[
            ("FLOODGATE_ADMIN_ADDR", "127.0.0.1:0"),
            ("FLOODGATE_ADMIN_TOKEN", TOKEN),
            ("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "2000"),
        ],
    )
}

const ALICE: &str = r#"{"domain": "admin", "descriptor": [{"key": "user", "value": "alice"}]}"#;

/// An admin request with `token`; status and body.
fn admin(server: &Floodgate, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let bearer = token.map(|token| format!("Bearer {token}"));
    let headers: Vec<(&str, &str)> = bearer
        .iter()
        .map(|value| ("authorization", value.as_str()))
        .collect();
    admin_with(server, path, &headers, body)
}

/// An admin request with `headers` as given; status and body.
fn admin_with(
    server: &Floodgate,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let addr = server.admin_addr.expect("the admin API is on");
    http_with(addr, "POST", path, headers, body)
}

/// Each limit's `remaining` in an answer of `POST /admin/v1/counters`.
fn remaining(body: &str) -> Vec<u64> {
    let answer: serde_json::Value = serde_json::from_str(body).expect("JSON");
    (answer["limits"].as_array().expect("limits").iter())
        .map(|limit| limit["remaining"].as_u64().expect("remaining"))
        .collect()
}

/// Three hits exhaust alice's hourly limit; the admin API reads them, resets them, and
/// alice is allowed again. How many states the reset said it cleared.
async fn read_and_reset(server: &Floodgate) -> u64 {
    let ask = || request("admin", vec![descriptor(&[("user", "alice")])]);
    for _ in 0..3 {
        assert_eq!(server.ask(ask()).await.overall_code, OK);
    }
    assert_eq!(server.ask(ask()).await.overall_code, OVER_LIMIT);

    let (status, body) = admin(server, "/admin/v1/counters", Some(TOKEN), ALICE);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""rule":"admin.user""#), "{body}");
    // The daily log counted the refused fourth hit too (consume_on_reject, the default).
    assert_eq!(remaining(&body), [0, 6], "{body}");
    let (_, again) = admin(server, "/admin/v1/counters", Some(TOKEN), ALICE);
    assert_eq!(remaining(&again), [0, 6], "reading counts nothing: {again}");

    let (status, body) = admin(server, "/admin/v1/counters/reset", Some(TOKEN), ALICE);
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let (_, body) = admin(server, "/admin/v1/counters", Some(TOKEN), ALICE);
    assert_eq!(remaining(&body), [3, 10], "{body}");
    assert_eq!(
        server.ask(ask()).await.overall_code,
        OK,
        "alice starts over"
    );
    answer["reset"].as_u64().expect("reset")
}

#[tokio::test]
async fn on_memory_counters_are_read_without_counting_and_reset() {
    let cleared = read_and_reset(&start(&[])).await;
    assert_eq!(cleared, 2, "the hourly and the daily counter");
}

#[tokio::test]
async fn on_redis_a_reset_reaches_redis_and_the_over_limit_cache() {
    let redis = RedisServer::start();
    let url = redis.url();
    let server = start(&["--backend", "redis", "--redis-url", &url]);
    let cleared = read_and_reset(&server).await;
    assert_eq!(cleared, 3, "keys: the hourly window's and the log's two");
    // alice's one new hit: the hourly window's key and the log's two keys.
    assert_eq!(redis.command(&["DBSIZE"]), "3");
}

#[tokio::test]
async fn every_admin_request_needs_the_token() {
    let server = start(&[]);
    for token in [None, Some("wrong"), Some("0123-admin-tokem")] {
        for path in ["/admin/v1/counters", "/admin/v1/counters/reset"] {
            let (status, _) = admin(&server, path, token, ALICE);
            assert_eq!(status, 401, "{path} with {token:?}");
        }
    }
    let unknown = r#"{"domain": "admin", "descriptor": [{"key": "nobody", "value": "x"}]}"#;
    assert_eq!(
        admin(&server, "/admin/v1/counters", Some(TOKEN), unknown).0,
        404
    );
    assert_eq!(
        admin(&server, "/admin/v1/counters", Some(TOKEN), "{}").0,
        400
    );
}

#[tokio::test]
async fn the_auth_scheme_is_any_case_and_the_token_exact() {
    let server = start(&[]);
    let status = |authorization: &str| {
        let headers = [("authorization", authorization)];
        admin_with(&server, "/admin/v1/counters", &headers, ALICE).0
    };
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        assert_eq!(status(&format!("{scheme} {TOKEN}")), 200, "{scheme}");
    }
    assert_eq!(
        status(&format!("bearer   {TOKEN}")),
        200,
        "spaces before the token"
    );
    let refused = [
        TOKEN.to_owned(),
        format!("Bearer{TOKEN}"),
        format!("Basic {TOKEN}"),
        format!("Bearer {}", TOKEN.to_uppercase()),
        format!("Bearer {TOKEN}0"),
        format!("Bearer x {TOKEN}"),
    ];
    for authorization in refused {
        assert_eq!(status(&authorization), 401, "{authorization}");
    }
}

/// `curl -d` labels its body `application/x-www-form-urlencoded`; the body is JSON all the
/// same, and the admin API reads it as `POST /json` reads its own.
#[tokio::test]
async fn a_json_body_is_read_whatever_its_content_type() {
    let server = start(&[]);
    let bearer = format!("Bearer {TOKEN}");
    let check =
        r#"{"domain": "admin", "descriptors": [{"entries": [{"key": "user", "value": "gina"}]}]}"#;
    for content_type in [
        "application/x-www-form-urlencoded",
        "text/plain",
        "application/json; charset=utf-8",
    ] {
        let headers = [("content-type", content_type)];
        let (status, body) = http_with(server.http_addr, "POST", "/json", &headers, check);
        assert_eq!(status, 200, "/json as {content_type}: {body}");
        let headers = [
            ("authorization", bearer.as_str()),
            ("content-type", content_type),
        ];
        for path in ["/admin/v1/counters", "/admin/v1/counters/reset"] {
            let (status, body) = admin_with(&server, path, &headers, ALICE);
            assert_eq!(status, 200, "{path} as {content_type}: {body}");
        }
        let (status, body) = admin_with(&server, "/admin/v1/counters", &headers, "user=alice");
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("invalid JSON"), "{content_type}: {body}");
    }
}

/// A web page may POST a `text/plain` body cross-site without a CORS preflight, and the
/// browser presents its client certificate; the browser's `Origin` header gives it away.
#[tokio::test]
async fn a_request_from_a_browser_is_refused() {
    let server = start(&[]);
    let bearer = format!("Bearer {TOKEN}");
    for origin in ["https://attacker.example", "null"] {
        let headers = [
            ("authorization", bearer.as_str()),
            ("content-type", "text/plain"),
            ("origin", origin),
        ];
        for path in ["/admin/v1/counters", "/admin/v1/counters/reset"] {
            let (status, body) = admin_with(&server, path, &headers, ALICE);
            assert_eq!(status, 403, "{path} from {origin}: {body}");
            assert!(body.contains("Origin"), "{body}");
        }
    }
}

#[tokio::test]
async fn a_reset_on_memory_answers_how_many_counters_it_cleared() {
    let server = start(&[]);
    let ask = request("admin", vec![descriptor(&[("user", "hana")])]);
    assert_eq!(server.ask(ask).await.overall_code, OK);
    let hana = ALICE.replace("alice", "hana");
    let reset = || {
        let (status, body) = admin(&server, "/admin/v1/counters/reset", Some(TOKEN), &hana);
        assert_eq!(status, 200, "{body}");
        let answer: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        answer["reset"].as_u64().expect("reset")
    };
    assert_eq!(reset(), 2, "the hourly and the daily counter");
    assert_eq!(reset(), 0, "nothing left to clear");
}

/// Each limit's `over_limit` in an answer of `POST /admin/v1/counters`.
fn over_limit(body: &str) -> Vec<bool> {
    let answer: serde_json::Value = serde_json::from_str(body).expect("JSON");
    (answer["limits"].as_array().expect("limits").iter())
        .map(|limit| limit["over_limit"].as_bool().expect("over_limit"))
        .collect()
}

#[tokio::test]
async fn over_limit_means_the_next_request_would_be_refused() {
    let server = start(&[]);
    let ask = || request("admin", vec![descriptor(&[("user", "ivan")])]);
    let ivan = ALICE.replace("alice", "ivan");
    let read = || admin(&server, "/admin/v1/counters", Some(TOKEN), &ivan).1;
    for _ in 0..2 {
        assert_eq!(server.ask(ask()).await.overall_code, OK);
    }
    assert_eq!(over_limit(&read()), [false, false], "one hit left");
    assert_eq!(server.ask(ask()).await.overall_code, OK);
    let body = read();
    assert_eq!(remaining(&body), [0, 7], "{body}");
    assert_eq!(
        over_limit(&body),
        [true, false],
        "the hourly limit is spent"
    );
    assert_eq!(server.ask(ask()).await.overall_code, OVER_LIMIT);
    assert_eq!(over_limit(&read()), [true, false]);
}

#[test]
fn the_admin_api_is_off_by_default_and_never_open() {
    let server = Floodgate::start(&[("admin.yaml", RULES)], &[]);
    assert_eq!(server.admin_addr, None);
    let stderr = harness::refused_start(
        &harness::SERVE_ANYWHERE,
        &[("FLOODGATE_ADMIN_ADDR", "127.0.0.1:0")],
    );
    assert!(
        stderr.contains("admin_token") && stderr.contains("admin_tls.client_ca_file"),
        "{stderr}"
    );
}

#[tokio::test]
async fn the_cli_reads_and_resets_through_the_admin_api() {
    let server = start(&[]);
    let ask = request("admin", vec![descriptor(&[("user", "bob")])]);
    assert_eq!(server.ask(ask.clone()).await.overall_code, OK);
    let addr = server.admin_addr.expect("the admin API").to_string();
    let counters = |action: &str, token: &str| {
        harness::command()
            .args(["counters", action, "--addr", &addr, "--domain", "admin"])
            .args(["--descriptor", "user=bob"])
            .env("FLOODGATE_ADMIN_TOKEN", token)
            .output()
            .expect("floodgate runs")
    };
    let got = counters("get", TOKEN);
    assert!(
        got.status.success(),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    assert_eq!(remaining(&String::from_utf8_lossy(&got.stdout)), [2, 9]);
    assert!(counters("reset", TOKEN).status.success());
    let after = counters("get", TOKEN);
    assert_eq!(remaining(&String::from_utf8_lossy(&after.stdout)), [3, 10]);
    assert!(
        !counters("get", "wrong").status.success(),
        "a wrong token fails the command"
    );
}

#[tokio::test]
async fn the_grpc_form_reads_and_resets_behind_the_same_token() {
    use floodgate::proto::floodgate::admin::v1::counter_admin_client::CounterAdminClient;
    use floodgate::proto::floodgate::admin::v1::{CounterRequest, Entry};

    let server = start(&[]);
    let ask = request("admin", vec![descriptor(&[("user", "carol")])]);
    assert_eq!(server.ask(ask.clone()).await.overall_code, OK);
    let addr = format!("http://{}", server.admin_addr.expect("the admin API"));
    let channel = tonic::transport::Endpoint::from_shared(addr)
        .expect("an endpoint")
        .connect()
        .await
        .expect("the admin port speaks HTTP/2");
    let with_token = |token: &'static str| {
        move |mut request: tonic::Request<()>| {
            let bearer = format!("Bearer {token}").parse().expect("metadata");
            request.metadata_mut().insert("authorization", bearer);
            Ok(request)
        }
    };
    let carol = || CounterRequest {
        domain: "admin".into(),
        descriptor: vec![Entry {
            key: "user".into(),
            value: "carol".into(),
        }],
    };
    let mut admin = CounterAdminClient::with_interceptor(channel.clone(), with_token(TOKEN));
    let counters = admin
        .get_counters(carol())
        .await
        .expect("counters")
        .into_inner();
    assert_eq!(counters.rule, "admin.user");
    let remaining: Vec<u64> = counters.limits.iter().map(|l| l.remaining).collect();
    assert_eq!(remaining, [2, 9]);
    let reset = admin
        .reset_counters(carol())
        .await
        .expect("a reset")
        .into_inner();
    assert_eq!(reset.rule, "admin.user");
    let counters = admin
        .get_counters(carol())
        .await
        .expect("counters")
        .into_inner();
    let remaining: Vec<u64> = counters.limits.iter().map(|l| l.remaining).collect();
    assert_eq!(remaining, [3, 10]);

    let mut stranger = CounterAdminClient::with_interceptor(channel, with_token("wrong"));
    let refused = stranger.get_counters(carol()).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
}

/// A floodgate whose admin API is on mutual TLS with `certificates`, and needs `token` too
/// where one is given.
fn start_mutual_tls(certificates: &Certificates, token: Option<&str>) -> Floodgate {
    let [cert, key, ca] = certificates.mutual_server_files();
    let mut env = vec![
        ("FLOODGATE_ADMIN_ADDR", "127.0.0.1:0"),
        ("FLOODGATE_ADMIN_TLS__CERT_FILE", cert.as_str()),
        ("FLOODGATE_ADMIN_TLS__KEY_FILE", key.as_str()),
        ("FLOODGATE_ADMIN_TLS__CLIENT_CA_FILE", ca.as_str()),
    ];
    if let Some(token) = token {
        env.push(("FLOODGATE_ADMIN_TOKEN", token));
    }
    Floodgate::start_with_env(&[("admin.yaml", RULES)], &[], &env)
}

/// `floodgate counters get` for dave over TLS, trusting the test CA, presenting `client`
/// and `token` where given: whether it succeeded, and what it printed.
fn counters_over_tls(
    server: &Floodgate,
    certificates: &Certificates,
    client: Option<Pair>,
    token: Option<&str>,
) -> (bool, String) {
    let addr = server.admin_addr.expect("the admin API").to_string();
    let mut command = harness::command();
    command
        .args(["counters", "get", "--addr", &addr, "--domain", "admin"])
        .args(["--descriptor", "user=dave", "--ca-file"])
        .arg(certificates.ca())
        .env_remove("FLOODGATE_ADMIN_TOKEN");
    if let Some(client) = client {
        command.arg("--cert-file").arg(&client.cert);
        command.arg("--key-file").arg(&client.key);
    }
    if let Some(token) = token {
        command.args(["--token", token]);
    }
    let output = command.output().expect("floodgate runs");
    let printed = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), printed)
}

#[tokio::test]
async fn mutual_tls_stands_in_for_the_token() {
    let certificates = Certificates::generate();
    let server = start_mutual_tls(&certificates, None);
    let ask = request("admin", vec![descriptor(&[("user", "dave")])]);
    assert_eq!(server.ask(ask).await.overall_code, OK);

    let (ok, printed) =
        counters_over_tls(&server, &certificates, Some(certificates.client()), None);
    assert!(ok, "{printed}");
    assert_eq!(
        remaining(printed.lines().next().unwrap_or_default()),
        [2, 9]
    );

    let (ok, printed) = counters_over_tls(&server, &certificates, None, None);
    assert!(!ok, "a client without a certificate is refused: {printed}");
    let (ok, printed) =
        counters_over_tls(&server, &certificates, Some(certificates.stranger()), None);
    assert!(!ok, "a certificate of another CA is refused: {printed}");
    let plain = harness::command()
        .args(["counters", "get", "--addr"])
        .arg(server.admin_addr.expect("the admin API").to_string())
        .args(["--domain", "admin", "--descriptor", "user=dave"])
        .env_remove("FLOODGATE_ADMIN_TOKEN")
        .output()
        .expect("floodgate runs");
    assert!(!plain.status.success(), "plain HTTP gets nothing");
}

#[tokio::test]
async fn with_both_set_mutual_tls_and_the_token_are_both_required() {
    let certificates = Certificates::generate();
    let server = start_mutual_tls(&certificates, Some(TOKEN));
    let client = || Some(certificates.client());
    let (ok, printed) = counters_over_tls(&server, &certificates, client(), None);
    assert!(!ok && printed.contains("401"), "no token: {printed}");
    let (ok, printed) = counters_over_tls(&server, &certificates, None, Some(TOKEN));
    assert!(!ok, "no certificate: {printed}");
    let (ok, printed) = counters_over_tls(&server, &certificates, client(), Some(TOKEN));
    assert!(ok, "{printed}");
}

#[tokio::test]
async fn the_grpc_form_takes_a_client_certificate() {
    use floodgate::proto::floodgate::admin::v1::counter_admin_client::CounterAdminClient;
    use floodgate::proto::floodgate::admin::v1::{CounterRequest, Entry};
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

    let certificates = Certificates::generate();
    let server = start_mutual_tls(&certificates, None);
    let read = |path| std::fs::read(path).expect("a certificate file");
    let client = certificates.client();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(certificates.ca())))
        .domain_name("localhost")
        .identity(Identity::from_pem(read(client.cert), read(client.key)));
    let addr = format!("https://{}", server.admin_addr.expect("the admin API"));
    let channel = (Endpoint::from_shared(addr).expect("an endpoint"))
        .tls_config(tls)
        .expect("TLS settings")
        .connect()
        .await
        .expect("the admin port speaks HTTP/2 over TLS");
    let answer = CounterAdminClient::new(channel)
        .get_counters(CounterRequest {
            domain: "admin".into(),
            descriptor: vec![Entry {
                key: "user".into(),
                value: "erin".into(),
            }],
        })
        .await
        .expect("counters without a token")
        .into_inner();
    assert_eq!(answer.rule, "admin.user");
}
