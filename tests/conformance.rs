//! Conformance with envoyproxy/ratelimit's documented behaviour, through a real gRPC client
//! against the `floodgate` binary. Its README examples 1–9 appear with their structure; where
//! they count within one second, the unit is lengthened to a day so the tests never depend
//! on where a second boundary falls.

mod harness;

use floodgate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus,
};
use floodgate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use floodgate::proto::envoy::r#type::v3::RateLimitUnit;
use harness::{Floodgate, descriptor, request};

const OK: i32 = Code::Ok as i32;
const OVER_LIMIT: i32 = Code::OverLimit as i32;

fn single(domain: &str, entries: &[(&str, &str)]) -> RateLimitRequest {
    request(domain, vec![descriptor(entries)])
}

/// (requests_per_unit, unit, name) of a status's current_limit.
fn limit(status: &DescriptorStatus) -> Option<(u32, Unit, &str)> {
    status.current_limit.as_ref().map(|l| {
        (
            l.requests_per_unit,
            Unit::try_from(l.unit).expect("a known unit"),
            l.name.as_str(),
        )
    })
}

/// Sends the same request `n` times and returns the last response.
async fn repeat(server: &Floodgate, n: usize, req: &RateLimitRequest) -> RateLimitResponse {
    let mut client = server.client().await;
    let mut last = None;
    for _ in 0..n {
        last = Some(
            client
                .should_rate_limit(req.clone())
                .await
                .expect("ok")
                .into_inner(),
        );
    }
    last.expect("n > 0")
}

const EXAMPLE1: &str = "
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
";

#[tokio::test]
async fn example1_exact_value_gets_its_limit() {
    let server = Floodgate::start(&[("ex1.yaml", EXAMPLE1)], &[]);
    let response = server
        .ask(single("mongo_cps", &[("database", "users")]))
        .await;
    assert_eq!(response.overall_code, OK);
    assert_eq!(limit(&response.statuses[0]), Some((500, Unit::Second, "")));
    assert_eq!(response.statuses[0].limit_remaining, 499);
}

#[tokio::test]
async fn example1_unlisted_value_has_no_limit() {
    let server = Floodgate::start(&[("ex1.yaml", EXAMPLE1)], &[]);
    let response = server
        .ask(single("mongo_cps", &[("database", "orders")]))
        .await;
    assert_eq!(response.overall_code, OK);
    assert_eq!(response.statuses[0].code, OK);
    assert_eq!(response.statuses[0].current_limit, None);
    assert_eq!(response.statuses[0].limit_remaining, 0);
}

const EXAMPLE2: &str = "
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
";

#[tokio::test]
async fn example2_nested_default_limits_each_number_separately() {
    let server = Floodgate::start(&[("ex2.yaml", EXAMPLE2)], &[]);
    let first = single(
        "messaging",
        &[("message_type", "marketing"), ("to_number", "2061111111")],
    );
    let response = repeat(&server, 5, &first).await;
    assert_eq!(response.overall_code, OK);
    assert_eq!(response.statuses[0].limit_remaining, 0);
    let sixth = server.ask(first.clone()).await;
    assert_eq!(sixth.overall_code, OVER_LIMIT);
    assert_eq!(sixth.statuses[0].code, OVER_LIMIT);
    let other = server
        .ask(single(
            "messaging",
            &[("message_type", "marketing"), ("to_number", "2062222222")],
        ))
        .await;
    assert_eq!(other.overall_code, OK);
    assert_eq!(other.statuses[0].limit_remaining, 4);
}

#[tokio::test]
async fn example2_key_only_default_matches_any_value() {
    let server = Floodgate::start(&[("ex2.yaml", EXAMPLE2)], &[]);
    let response = server
        .ask(single("messaging", &[("to_number", "2061111111")]))
        .await;
    assert_eq!(limit(&response.statuses[0]), Some((100, Unit::Day, "")));
    assert_eq!(response.statuses[0].limit_remaining, 99);
}

#[tokio::test]
async fn example2_node_without_limit_is_only_a_placeholder() {
    let server = Floodgate::start(&[("ex2.yaml", EXAMPLE2)], &[]);
    let response = server
        .ask(single("messaging", &[("message_type", "marketing")]))
        .await;
    assert_eq!(response.statuses[0].current_limit, None);
}

#[tokio::test]
async fn example2_several_descriptors_combine_as_logical_or() {
    let server = Floodgate::start(&[("ex2.yaml", EXAMPLE2)], &[]);
    let both = request(
        "messaging",
        vec![
            descriptor(&[("message_type", "marketing"), ("to_number", "2061111111")]),
            descriptor(&[("to_number", "2061111111")]),
        ],
    );
    repeat(&server, 5, &both).await;
    let response = server.ask(both).await;
    assert_eq!(response.overall_code, OVER_LIMIT);
    assert_eq!(response.statuses[0].code, OVER_LIMIT);
    assert_eq!(response.statuses[1].code, OK);
    assert_eq!(response.statuses[1].limit_remaining, 94);
}

const EXAMPLE3: &str = "
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
";

#[tokio::test]
async fn example3_specific_value_beats_the_key_only_default() {
    let server = Floodgate::start(&[("ex3.yaml", EXAMPLE3)], &[]);
    let blocked = server
        .ask(single(
            "edge_proxy_per_ip",
            &[("remote_address", "50.0.0.5")],
        ))
        .await;
    assert_eq!(blocked.overall_code, OVER_LIMIT);
    assert_eq!(limit(&blocked.statuses[0]), Some((0, Unit::Second, "")));
    let other = server
        .ask(single(
            "edge_proxy_per_ip",
            &[("remote_address", "50.0.0.1")],
        ))
        .await;
    assert_eq!(other.overall_code, OK);
    assert_eq!(limit(&other.statuses[0]), Some((10, Unit::Second, "")));
}

const EXAMPLE4_SHALLOW: &str = "
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
";

const EXAMPLE4_NESTED: &str = "
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
";

#[tokio::test]
async fn example4_longer_descriptor_does_not_match_a_shallower_rule() {
    let server = Floodgate::start(&[("ex4.yaml", EXAMPLE4_SHALLOW)], &[]);
    let response = server
        .ask(single(
            "example4",
            &[("key", "value"), ("subkey", "subvalue")],
        ))
        .await;
    assert_eq!(response.statuses[0].current_limit, None);
}

#[tokio::test]
async fn example4_nested_rule_matches_at_its_own_depth() {
    let server = Floodgate::start(&[("ex4.yaml", EXAMPLE4_NESTED)], &[]);
    let response = server
        .ask(single(
            "example4",
            &[("key", "value"), ("subkey", "subvalue")],
        ))
        .await;
    assert_eq!(limit(&response.statuses[0]), Some((300, Unit::Second, "")));
}

#[tokio::test]
async fn shorter_descriptor_does_not_match_a_deeper_rule() {
    let server = Floodgate::start(&[("ex4.yaml", EXAMPLE4_NESTED)], &[]);
    let response = server.ask(single("example4", &[("key", "value")])).await;
    assert_eq!(response.statuses[0].current_limit, None);
}

const EXAMPLE5: &str = "
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true
  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
";

#[tokio::test]
async fn example5_unlimited_answers_ok_with_max_remaining_and_no_limit() {
    let server = Floodgate::start(&[("ex5.yaml", EXAMPLE5)], &[]);
    let response = repeat(&server, 3, &single("internal", &[("ldap", "x")])).await;
    assert_eq!(response.statuses[0].code, OK);
    assert_eq!(response.statuses[0].limit_remaining, u32::MAX);
    assert_eq!(response.statuses[0].current_limit, None);
}

#[tokio::test]
async fn example5_limited_sibling_counts() {
    let server = Floodgate::start(&[("ex5.yaml", EXAMPLE5)], &[]);
    let response = server.ask(single("internal", &[("azure", "x")])).await;
    assert_eq!(limit(&response.statuses[0]), Some((100, Unit::Minute, "")));
    assert_eq!(response.statuses[0].limit_remaining, 99);
}

const EXAMPLE6: &str = "
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: day
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: day
";

#[tokio::test]
async fn example6_shadow_mode_rule_counts_but_never_rejects() {
    let server = Floodgate::start(&[("ex6.yaml", EXAMPLE6)], &[]);
    let req = single(
        "example6",
        &[("service", "auth-service"), ("user", "user-a")],
    );
    let response = repeat(&server, 12, &req).await;
    assert_eq!(response.overall_code, OK);
    assert_eq!(response.statuses[0].code, OK);
    assert_eq!(response.statuses[0].limit_remaining, 0);
}

#[tokio::test]
async fn example6_sibling_without_shadow_mode_is_enforced() {
    let server = Floodgate::start(&[("ex6.yaml", EXAMPLE6)], &[]);
    let req = single(
        "example6",
        &[("service", "auth-service"), ("user", "user-b")],
    );
    assert_eq!(repeat(&server, 20, &req).await.overall_code, OK);
    assert_eq!(server.ask(req).await.overall_code, OVER_LIMIT);
}

const EXAMPLE7: &str = "
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: day
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: day
";

fn example7_both() -> RateLimitRequest {
    request(
        "example7",
        vec![
            descriptor(&[("key_1", "value_1"), ("user", "bkthomps")]),
            descriptor(&[("key_2", "value_2"), ("user", "bkthomps")]),
        ],
    )
}

#[tokio::test]
async fn example7_replacing_rule_applies_alone_when_both_match() {
    let server = Floodgate::start(&[("ex7.yaml", EXAMPLE7)], &[]);
    let response = repeat(&server, 6, &example7_both()).await;
    assert_eq!(response.overall_code, OK);
    assert_eq!(response.statuses[0].code, OK);
    assert_eq!(response.statuses[0].current_limit, None);
    assert_eq!(limit(&response.statuses[1]), Some((10, Unit::Day, "")));
    assert_eq!(response.statuses[1].limit_remaining, 4);
}

#[tokio::test]
async fn example7_replaced_rule_is_not_counted_when_replaced() {
    let server = Floodgate::start(&[("ex7.yaml", EXAMPLE7)], &[]);
    repeat(&server, 6, &example7_both()).await;
    let alone = server
        .ask(single(
            "example7",
            &[("key_1", "value_1"), ("user", "bkthomps")],
        ))
        .await;
    assert_eq!(
        limit(&alone.statuses[0]),
        Some((5, Unit::Day, "specific_limit"))
    );
    assert_eq!(alone.statuses[0].limit_remaining, 4);
}

const EXAMPLE8: &str = "
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
";

#[tokio::test]
async fn example8_detailed_metric_default_still_limits_each_value() {
    let server = Floodgate::start(&[("ex8.yaml", EXAMPLE8)], &[]);
    let a = server
        .ask(single("example8", &[("key1", "unspecified_value")]))
        .await;
    let b = server
        .ask(single("example8", &[("key1", "unspecified_value2")]))
        .await;
    let c = server.ask(single("example8", &[("key1", "value1")])).await;
    assert_eq!(limit(&a.statuses[0]), Some((10, Unit::Minute, "")));
    assert_eq!(a.statuses[0].limit_remaining, 9);
    assert_eq!(b.statuses[0].limit_remaining, 9);
    assert_eq!(limit(&c.statuses[0]), Some((20, Unit::Minute, "")));
}

const WILDCARDS: &str = "
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: day
      requests_per_unit: 2
  - key: path
    value: /api/*/orders
    rate_limit:
      unit: day
      requests_per_unit: 3
  - key: path
    value: /api/v1/orders
    rate_limit:
      unit: day
      requests_per_unit: 30
  - key: path
    value: '*/items/*'
    rate_limit:
      unit: day
      requests_per_unit: 4
  - key: path
    value: '*'
    rate_limit:
      unit: day
      requests_per_unit: 5
  - key: path
    rate_limit:
      unit: day
      requests_per_unit: 6
  - key: file
    value: files/*
    share_threshold: true
    rate_limit:
      unit: day
      requests_per_unit: 2
  - key: first
    value: a*
    rate_limit:
      unit: day
      requests_per_unit: 7
  - key: first
    value: ab*
    rate_limit:
      unit: day
      requests_per_unit: 8
  - key: host
    value: exact
    descriptors:
      - key: method
        value: GET
        rate_limit:
          unit: day
          requests_per_unit: 9
  - key: host
    descriptors:
      - key: method
        rate_limit:
          unit: day
          requests_per_unit: 10
";

async fn limit_for(server: &Floodgate, entries: &[(&str, &str)]) -> Option<u32> {
    let response = server.ask(single("example9", entries)).await;
    limit(&response.statuses[0]).map(|(n, _, _)| n)
}

#[tokio::test]
async fn example9_trailing_wildcard_matches_values_with_its_prefix() {
    let server = Floodgate::start(&[("wild.yaml", WILDCARDS)], &[]);
    assert_eq!(limit_for(&server, &[("key1", "value_1")]).await, Some(2));
    assert_eq!(limit_for(&server, &[("key1", "value")]).await, Some(2));
    assert_eq!(limit_for(&server, &[("key1", "other")]).await, None);
}

#[tokio::test]
async fn example9_each_value_matching_a_wildcard_has_its_own_counter() {
    let server = Floodgate::start(&[("wild.yaml", WILDCARDS)], &[]);
    let one = single("example9", &[("key1", "value_1")]);
    assert_eq!(repeat(&server, 3, &one).await.overall_code, OVER_LIMIT);
    let two = server.ask(single("example9", &[("key1", "value_2")])).await;
    assert_eq!(two.overall_code, OK);
    assert_eq!(two.statuses[0].limit_remaining, 1);
}

#[tokio::test]
async fn wildcard_in_the_middle_of_a_value_matches() {
    let server = Floodgate::start(&[("wild.yaml", WILDCARDS)], &[]);
    assert_eq!(
        limit_for(&server, &[("path", "/api/v2/orders")]).await,
        Some(3)
    );
}

#[tokio::test]
async fn several_wildcards_in_one_value_match() {
    let server = Floodgate::start(&[("wild.yaml", WILDCARDS)], &[]);
    assert_eq!(
        limit_for(&server, &[("path", "/shop/items/42")]).await,
        Some(4)
    );
}

#[tokio::test]
async fn exact_value_beats_a_matching_wildcard() {
    let server = Floodgate::start(&[("wild.yaml", WILDCARDS)], &[]);
    assert_eq!(
        limit_for(&server, &[("path", "/api/v1/orders")]).await,
        Some(30)
    );
}

#[tokio::test]
async fn wildcard_value_matches_before_key_only_default() {
    let server = Floodgate::start(&[("wild.yaml", WILDCARDS)], &[]);
    assert_eq!(limit_for(&server, &[("path", "/anything")]).await, Some(5));
}

#[tokio::test]
async fn first_matching_wildcard_in_declaration_order_wins() {
    let server = Floodgate::start(&[("wild.yaml", WILDCARDS)], &[]);
    assert_eq!(limit_for(&server, &[("first", "abc")]).await, Some(7));
}

#[tokio::test]
async fn share_threshold_makes_all_matching_values_share_one_counter() {
    let server = Floodgate::start(&[("wild.yaml", WILDCARDS)], &[]);
    server
        .ask(single("example9", &[("file", "files/a.pdf")]))
        .await;
    server
        .ask(single("example9", &[("file", "files/b.csv")]))
        .await;
    let third = server
        .ask(single("example9", &[("file", "files/c.txt")]))
        .await;
    assert_eq!(third.overall_code, OVER_LIMIT);
}

#[tokio::test]
async fn matching_does_not_backtrack_after_an_exact_match_dead_end() {
    let server = Floodgate::start(&[("wild.yaml", WILDCARDS)], &[]);
    // host=exact matches exactly; its children have no `method=POST` and no default, and
    // the key-only `host` branch (which would match) is not tried.
    assert_eq!(
        limit_for(&server, &[("host", "exact"), ("method", "POST")]).await,
        None
    );
    assert_eq!(
        limit_for(&server, &[("host", "exact"), ("method", "GET")]).await,
        Some(9)
    );
    assert_eq!(
        limit_for(&server, &[("host", "other"), ("method", "POST")]).await,
        Some(10)
    );
}

const COUNTING: &str = "
domain: counting
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 3
  - key: blocked
    rate_limit:
      unit: day
      requests_per_unit: 0
  - key: named
    rate_limit:
      name: per_day
      unit: day
      requests_per_unit: 10
";

#[tokio::test]
async fn unknown_domain_means_no_limit() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &[]);
    let response = server.ask(single("nowhere", &[("user", "a")])).await;
    assert_eq!(response.overall_code, OK);
    assert_eq!(response.statuses[0].current_limit, None);
}

#[tokio::test]
async fn over_limit_when_the_count_after_the_hit_exceeds_the_limit() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &[]);
    let req = single("counting", &[("user", "a")]);
    let third = repeat(&server, 3, &req).await;
    assert_eq!(third.overall_code, OK);
    assert_eq!(third.statuses[0].limit_remaining, 0);
    let fourth = server.ask(req).await;
    assert_eq!(fourth.overall_code, OVER_LIMIT);
    assert_eq!(fourth.statuses[0].limit_remaining, 0);
    let reset = fourth.statuses[0]
        .duration_until_reset
        .expect("a reset time");
    assert!(reset.seconds > 0 && reset.seconds <= 86_400, "{reset:?}");
}

#[tokio::test]
async fn requests_per_unit_zero_blocks_everything() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &[]);
    let response = server.ask(single("counting", &[("blocked", "x")])).await;
    assert_eq!(response.overall_code, OVER_LIMIT);
}

#[tokio::test]
async fn limit_name_is_returned_in_current_limit() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &[]);
    let response = server.ask(single("counting", &[("named", "x")])).await;
    assert_eq!(
        limit(&response.statuses[0]),
        Some((10, Unit::Day, "per_day"))
    );
}

#[tokio::test]
async fn request_hits_addend_costs_that_many_hits() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &[]);
    let mut req = single("counting", &[("named", "x")]);
    req.hits_addend = 4;
    assert_eq!(server.ask(req).await.statuses[0].limit_remaining, 6);
}

#[tokio::test]
async fn request_hits_addend_zero_means_one() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &[]);
    let mut req = single("counting", &[("named", "x")]);
    req.hits_addend = 0;
    assert_eq!(server.ask(req).await.statuses[0].limit_remaining, 9);
}

#[tokio::test]
async fn descriptor_hits_addend_beats_the_request_hits_addend() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &[]);
    let mut req = single("counting", &[("named", "x")]);
    req.hits_addend = 4;
    req.descriptors[0].hits_addend = Some(pbjson_types::UInt64Value { value: 2 });
    assert_eq!(server.ask(req).await.statuses[0].limit_remaining, 8);
}

#[tokio::test]
async fn descriptor_hits_addend_zero_only_checks() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &[]);
    let mut req = single("counting", &[("named", "x")]);
    req.hits_addend = 4;
    req.descriptors[0].hits_addend = Some(pbjson_types::UInt64Value { value: 0 });
    let first = server.ask(req.clone()).await;
    let second = server.ask(req).await;
    assert_eq!(first.statuses[0].limit_remaining, 10);
    assert_eq!(second.statuses[0].limit_remaining, 10);
}

#[tokio::test]
async fn negative_hits_give_quota_back_but_never_below_empty() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &[]);
    let mut take = single("counting", &[("named", "x")]);
    take.hits_addend = 3;
    server.ask(take).await;
    let mut give = single("counting", &[("named", "x")]);
    give.hits_addend = 5;
    give.descriptors[0].is_negative_hits = true;
    let response = server.ask(give).await;
    assert_eq!(response.overall_code, OK);
    assert_eq!(response.statuses[0].limit_remaining, 10);
}

#[tokio::test]
async fn override_bypasses_the_rule_tree() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &[]);
    let mut req = single("counting", &[("user", "a")]);
    req.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: RateLimitUnit::Hour as i32,
        unit_multiplier: None,
    });
    let first = server.ask(req.clone()).await;
    assert_eq!(limit(&first.statuses[0]), Some((1, Unit::Hour, "")));
    assert_eq!(
        first.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .unit_multiplier,
        None
    );
    assert_eq!(server.ask(req).await.overall_code, OVER_LIMIT);
    // The configured rule's counter was not touched.
    let configured = server.ask(single("counting", &[("user", "a")])).await;
    assert_eq!(configured.statuses[0].limit_remaining, 2);
}

#[tokio::test]
async fn override_unit_multiplier_is_honoured_and_reported() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &[]);
    let mut req = single("counting", &[("user", "a")]);
    req.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 5,
        unit: RateLimitUnit::Minute as i32,
        unit_multiplier: Some(pbjson_types::UInt32Value { value: 30 }),
    });
    let response = server.ask(req).await;
    let current = response.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        current.unit_multiplier,
        Some(pbjson_types::UInt32Value { value: 30 })
    );
    let reset = response.statuses[0].duration_until_reset.unwrap();
    assert!(reset.seconds <= 30 * 60 && reset.seconds > 0, "{reset:?}");
}

#[tokio::test]
async fn override_with_unit_unknown_is_invalid_argument() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &[]);
    let mut req = single("counting", &[("user", "a")]);
    req.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 5,
        unit: RateLimitUnit::Unknown as i32,
        unit_multiplier: None,
    });
    let status = server.ask_err(req).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("UNKNOWN"), "{}", status.message());
}

#[tokio::test]
async fn an_override_window_beyond_a_hundred_years_is_invalid_argument_as_in_rule_files() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &[]);
    let with_years = |years: u32| {
        let mut req = single("counting", &[("user", "a")]);
        req.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: 5,
            unit: RateLimitUnit::Year as i32,
            unit_multiplier: Some(pbjson_types::UInt32Value { value: years }),
        });
        req
    };
    assert_eq!(server.ask(with_years(100)).await.overall_code, OK);
    for years in [101, 10_000_000] {
        let status = server.ask_err(with_years(years)).await;
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{years}");
        assert!(
            status.message().contains("longer than 100 years"),
            "{}",
            status.message()
        );
    }
}

#[tokio::test]
async fn statuses_have_the_request_order_and_length() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &[]);
    let response = server
        .ask(request(
            "counting",
            vec![
                descriptor(&[("named", "x")]),
                descriptor(&[("nothing", "x")]),
                descriptor(&[("blocked", "x")]),
                descriptor(&[("user", "a")]),
            ],
        ))
        .await;
    let codes: Vec<i32> = response.statuses.iter().map(|s| s.code).collect();
    assert_eq!(codes, [OK, OK, OVER_LIMIT, OK]);
    assert_eq!(limit(&response.statuses[0]).map(|l| l.0), Some(10));
    assert_eq!(response.statuses[1].current_limit, None);
    assert_eq!(limit(&response.statuses[3]).map(|l| l.0), Some(3));
}

#[tokio::test]
async fn global_shadow_mode_answers_ok_overall_and_keeps_statuses() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &["--shadow-mode"]);
    let response = server.ask(single("counting", &[("blocked", "x")])).await;
    assert_eq!(response.overall_code, OK);
    assert_eq!(response.statuses[0].code, OVER_LIMIT);
}

const QUOTA: &str = "
domain: quota
descriptors:
  - key: model
    quota_mode: true
    metadata:
      backend: primary
    rate_limit:
      unit: day
      requests_per_unit: 1
  - key: tenant
    rate_limit:
      unit: day
      requests_per_unit: 100
";

#[tokio::test]
async fn quota_mode_descriptor_does_not_reject_while_another_quota_descriptor_has_quota() {
    let server = Floodgate::start(&[("q.yaml", QUOTA)], &[]);
    let req = request(
        "quota",
        vec![
            descriptor(&[("model", "big")]),
            descriptor(&[("model", "small")]),
        ],
    );
    server.ask(single("quota", &[("model", "big")])).await;
    let response = server.ask(req).await;
    assert_eq!(response.statuses[0].code, OVER_LIMIT);
    assert_eq!(response.statuses[1].code, OK);
    assert_eq!(response.overall_code, OK);
}

#[tokio::test]
async fn quota_mode_rejects_when_every_quota_descriptor_is_over() {
    let server = Floodgate::start(&[("q.yaml", QUOTA)], &[]);
    let req = request(
        "quota",
        vec![
            descriptor(&[("model", "big")]),
            descriptor(&[("tenant", "t")]),
        ],
    );
    server.ask(req.clone()).await;
    let response = server.ask(req).await;
    assert_eq!(response.statuses[0].code, OVER_LIMIT);
    assert_eq!(response.overall_code, OVER_LIMIT);
}

#[tokio::test]
async fn global_quota_mode_makes_every_rule_soft() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &["--quota-mode"]);
    let response = server
        .ask(request(
            "counting",
            vec![
                descriptor(&[("blocked", "x")]),
                descriptor(&[("user", "a")]),
            ],
        ))
        .await;
    assert_eq!(response.statuses[0].code, OVER_LIMIT);
    assert_eq!(response.overall_code, OK);
}

/// Two rules whose metadata overlap: maps merge, the first scalar stays.
const META: &str = "
domain: meta
descriptors:
  - key: model
    metadata:
      backend: primary
      domain: from-a-rule
      route: {pool: a}
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: tenant
    metadata:
      backend: secondary
      tier: gold
      route: {zone: eu}
    rate_limit: {unit: day, requests_per_unit: 100}
";

/// `dynamic_metadata` in upstream's shape (envoyproxy/ratelimit #1112): the domain, the
/// descriptors' entries as `key=value`, the request's `hitsAddend`, and the metadata of the
/// rules under their limit merged under `metadata` (maps merged key by key, the first
/// descriptor's value kept otherwise), so a rule's key never clashes with the response's.
#[tokio::test]
async fn dynamic_metadata_carries_the_metadata_of_the_rules_under_their_limit() {
    let server = Floodgate::start(&[("m.yaml", META)], &["--dynamic-metadata"]);
    let ask = |hits| {
        let mut ask = request(
            "meta",
            vec![
                descriptor(&[("tenant", "t1")]),
                descriptor(&[("model", "big")]),
            ],
        );
        ask.hits_addend = hits;
        ask
    };
    let first = server.ask(ask(0)).await;
    let metadata = serde_json::to_value(first.dynamic_metadata.expect("metadata")).unwrap();
    assert_eq!(
        metadata,
        serde_json::json!({
            "domain": "meta",
            "descriptors": [{"entries": ["tenant=t1"]}, {"entries": ["model=big"]}],
            "metadata": {
                "backend": "secondary",
                "tier": "gold",
                "domain": "from-a-rule",
                "route": {"zone": "eu", "pool": "a"},
            },
        })
    );
    // The model's one a day is spent: only the tenant's rule is under its limit now.
    let second = server.ask(ask(1)).await;
    let metadata = serde_json::to_value(second.dynamic_metadata.expect("metadata")).unwrap();
    assert_eq!(metadata["hitsAddend"], 1.0);
    assert_eq!(
        metadata["metadata"],
        serde_json::json!({"backend": "secondary", "tier": "gold", "route": {"zone": "eu"}})
    );
    assert!(metadata.get("quotaModeEnabled").is_none(), "{metadata}");
}

#[tokio::test]
async fn no_dynamic_metadata_unless_enabled() {
    let server = Floodgate::start(&[("q.yaml", QUOTA)], &[]);
    let response = server.ask(single("quota", &[("model", "big")])).await;
    assert_eq!(response.dynamic_metadata, None);
}

const EXTENSIONS: &str = "
domain: ext
descriptors:
  - key: user
    rate_limits:
      - unit: day
        requests_per_unit: 5
        name: daily
      - unit: hour
        requests_per_unit: 2
        name: hourly
  - key: path
    rate_limit:
      unit: minute
      unit_multiplier: 5
      requests_per_unit: 300
";

#[tokio::test]
async fn several_limits_all_apply_and_the_status_shows_the_most_restrictive() {
    let server = Floodgate::start(&[("e.yaml", EXTENSIONS)], &[]);
    let req = single("ext", &[("user", "u")]);
    let first = server.ask(req.clone()).await;
    assert_eq!(limit(&first.statuses[0]), Some((2, Unit::Hour, "hourly")));
    assert_eq!(first.statuses[0].limit_remaining, 1);
    let third = repeat(&server, 2, &req).await;
    assert_eq!(third.overall_code, OVER_LIMIT);
    assert_eq!(limit(&third.statuses[0]), Some((2, Unit::Hour, "hourly")));
}

#[tokio::test]
async fn unit_multiplier_is_reported_on_current_limit() {
    let server = Floodgate::start(&[("e.yaml", EXTENSIONS)], &[]);
    let response = server.ask(single("ext", &[("path", "/")])).await;
    let current = response.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(current.unit, Unit::Minute as i32);
    assert_eq!(
        current.unit_multiplier,
        Some(pbjson_types::UInt32Value { value: 5 })
    );
}

fn header<'a>(response: &'a RateLimitResponse, key: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == key)
        .map(|h| h.value.as_str())
}

#[tokio::test]
async fn no_rate_limit_headers_by_default() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &[]);
    let response = server.ask(single("counting", &[("blocked", "x")])).await;
    assert!(response.response_headers_to_add.is_empty());
}

#[tokio::test]
async fn draft03_headers_show_limit_remaining_and_reset() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &["--response-headers", "draft03"]);
    let response = server.ask(single("counting", &[("named", "x")])).await;
    assert_eq!(
        header(&response, "x-ratelimit-limit"),
        Some("10, 10;w=86400;name=\"per_day\"")
    );
    assert_eq!(header(&response, "x-ratelimit-remaining"), Some("9"));
    let reset: u64 = header(&response, "x-ratelimit-reset")
        .unwrap()
        .parse()
        .unwrap();
    assert!(reset > 0 && reset <= 86_400);
    assert_eq!(header(&response, "retry-after"), None);
}

#[tokio::test]
async fn ietf_headers_are_structured_fields() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &["--response-headers", "ietf"]);
    let response = server.ask(single("counting", &[("named", "x")])).await;
    assert_eq!(
        header(&response, "ratelimit-policy"),
        Some("\"per_day\";q=10;w=86400")
    );
    let current = header(&response, "ratelimit").unwrap();
    assert!(current.starts_with("\"per_day\";r=9;t="), "{current}");
}

#[tokio::test]
async fn retry_after_comes_with_over_limit() {
    let server = Floodgate::start(&[("c.yaml", COUNTING)], &["--response-headers", "ietf"]);
    let response = server.ask(single("counting", &[("blocked", "x")])).await;
    assert_eq!(response.overall_code, OVER_LIMIT);
    let wait: u64 = header(&response, "retry-after").unwrap().parse().unwrap();
    assert!(wait <= 86_400);
}

#[tokio::test]
async fn retry_after_jitter_stays_within_its_bound() {
    let server = Floodgate::start(
        &[("c.yaml", COUNTING)],
        &["--response-headers", "draft03", "--retry-after-jitter", "5"],
    );
    let req = single("counting", &[("user", "a")]);
    repeat(&server, 3, &req).await;
    let over = server.ask(req).await;
    let reset: u64 = header(&over, "x-ratelimit-reset").unwrap().parse().unwrap();
    let wait: u64 = header(&over, "retry-after").unwrap().parse().unwrap();
    assert!(
        (reset..=reset + 5).contains(&wait),
        "reset {reset}, retry-after {wait}"
    );
}
