use super::*;
use crate::rules::testing::load_ok;
use crate::rules::{Policy, RuleSet};

/// The id of the rule `entries` match in `domain`, if any.
fn matched(
    rules: &RuleSet,
    domain: &str,
    entries: &[(&'static str, &'static str)],
) -> Option<String> {
    find(rules, domain, entries).map(|m| m.rule.id.clone())
}

fn find<'a>(
    rules: &'a RuleSet,
    domain: &str,
    entries: &[(&'static str, &'static str)],
) -> Option<Match<'a>> {
    // A match borrows its descriptor's strings: the test's descriptor lives as long as the test
    // process.
    let entries: &'static [Entry] = Vec::leak(owned(entries));
    rules.domain(domain).expect("domain loaded").find(entries)
}

fn requests_per_unit(m: &Match<'_>) -> u32 {
    match &m.rule.policy {
        Policy::Limited(limits) => limits[0].limit.requests_per_unit,
        Policy::Unlimited { .. } => u32::MAX,
    }
}

// ---- lookup order at one level ----

const ORDER: &str = "
    domain: d
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: path
        value: /v1/*
        rate_limit: {unit: second, requests_per_unit: 2}
      - key: path
        value: /v1/*/admin
        rate_limit: {unit: second, requests_per_unit: 3}
      - key: path
        value: /v1/users
        rate_limit: {unit: second, requests_per_unit: 4}
    ";

#[test]
fn exact_value_matches_before_wildcard() {
    let rules = load_ok(ORDER);
    assert_eq!(
        matched(&rules, "d", &[("path", "/v1/users")]).as_deref(),
        Some("d.path_/v1/users")
    );
}

#[test]
fn wildcard_value_matches_before_key_only_default() {
    let rules = load_ok(ORDER);
    assert_eq!(
        matched(&rules, "d", &[("path", "/v1/orders")]).as_deref(),
        Some("d.path_/v1/*")
    );
}

#[test]
fn first_matching_wildcard_in_declaration_order_wins() {
    // `/v1/*/admin` is more specific, but `/v1/*` comes first and matches too.
    let rules = load_ok(ORDER);
    assert_eq!(
        matched(&rules, "d", &[("path", "/v1/x/admin")]).as_deref(),
        Some("d.path_/v1/*")
    );
}

#[test]
fn key_only_default_matches_any_other_value() {
    let rules = load_ok(ORDER);
    assert_eq!(
        matched(&rules, "d", &[("path", "/v2/users")]).as_deref(),
        Some("d.path")
    );
}

#[test]
fn wildcard_of_another_key_does_not_match() {
    let rules = load_ok(
        "
        domain: d
        descriptors:
          - key: host
            value: '*'
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
    );
    assert_eq!(matched(&rules, "d", &[("path", "/anything")]), None);
}

#[test]
fn star_in_the_middle_matches() {
    let rules = load_ok(
        "
        domain: d
        descriptors:
          - key: path
            value: /v1/*/orders
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
    );
    assert!(matched(&rules, "d", &[("path", "/v1/42/orders")]).is_some());
    assert_eq!(matched(&rules, "d", &[("path", "/v1/42/orders/7")]), None);
}

#[test]
fn several_stars_match() {
    let rules = load_ok(
        "
        domain: d
        descriptors:
          - key: host
            value: '*.eu-*.example.com'
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
    );
    assert!(matched(&rules, "d", &[("host", "api.eu-west.example.com")]).is_some());
    assert_eq!(
        matched(&rules, "d", &[("host", "api.us-east.example.com")]),
        None
    );
}

#[test]
fn unknown_key_matches_nothing() {
    let rules = load_ok(ORDER);
    assert_eq!(matched(&rules, "d", &[("method", "GET")]), None);
}

#[test]
fn empty_descriptor_matches_nothing() {
    let rules = load_ok(ORDER);
    assert_eq!(matched(&rules, "d", &[]), None);
}

#[test]
fn whitelisted_descriptor_matches_nothing() {
    let rules = load_ok(
        "
        domain: d
        descriptors:
          - key: client
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: client
            value: health-checker
        ",
    );
    assert_eq!(matched(&rules, "d", &[("client", "health-checker")]), None);
    assert!(matched(&rules, "d", &[("client", "browser")]).is_some());
}

// ---- depth ----

const NESTED: &str = "
    domain: d
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 1}
        descriptors:
          - key: user
            descriptors:
              - key: path
                rate_limit: {unit: second, requests_per_unit: 3}
    ";

#[test]
fn rule_matches_a_descriptor_of_its_depth() {
    let rules = load_ok(NESTED);
    let id = matched(
        &rules,
        "d",
        &[("tenant", "t"), ("user", "u"), ("path", "/p")],
    );
    assert_eq!(id.as_deref(), Some("d.tenant.user.path"));
}

#[test]
fn rule_on_an_intermediate_node_matches_a_descriptor_ending_there() {
    let rules = load_ok(NESTED);
    assert_eq!(
        matched(&rules, "d", &[("tenant", "t")]).as_deref(),
        Some("d.tenant")
    );
}

#[test]
fn rule_on_an_intermediate_node_does_not_match_a_longer_descriptor() {
    let rules = load_ok(NESTED);
    assert_eq!(
        matched(&rules, "d", &[("tenant", "t"), ("user", "u")]),
        None
    );
}

#[test]
fn descriptor_longer_than_the_tree_matches_nothing() {
    let rules = load_ok(NESTED);
    let entries = [
        ("tenant", "t"),
        ("user", "u"),
        ("path", "/p"),
        ("extra", "x"),
    ];
    assert_eq!(matched(&rules, "d", &entries), None);
}

#[test]
fn descriptor_shorter_than_the_rule_depth_matches_nothing() {
    let rules = load_ok(
        "
        domain: d
        descriptors:
          - key: a
            descriptors:
              - key: b
                rate_limit: {unit: second, requests_per_unit: 1}
        ",
    );
    assert_eq!(matched(&rules, "d", &[("a", "1")]), None);
}

#[test]
fn no_backtracking_once_a_level_picked_its_node() {
    // The exact `a=x` node is chosen at the first level; it has no `b` below it, and the
    // key-only `a` (which does) is not tried instead.
    let rules = load_ok(
        "
        domain: d
        descriptors:
          - key: a
            value: x
            descriptors:
              - key: c
                rate_limit: {unit: second, requests_per_unit: 1}
          - key: a
            descriptors:
              - key: b
                rate_limit: {unit: second, requests_per_unit: 2}
        ",
    );
    assert_eq!(matched(&rules, "d", &[("a", "x"), ("b", "y")]), None);
    assert_eq!(
        matched(&rules, "d", &[("a", "z"), ("b", "y")]).as_deref(),
        Some("d.a.b")
    );
}

#[test]
fn no_backtracking_from_a_wildcard_to_the_default() {
    let rules = load_ok(
        "
        domain: d
        descriptors:
          - key: a
            value: x*
            descriptors:
              - key: c
                rate_limit: {unit: second, requests_per_unit: 1}
          - key: a
            descriptors:
              - key: b
                rate_limit: {unit: second, requests_per_unit: 2}
        ",
    );
    assert_eq!(matched(&rules, "d", &[("a", "xy"), ("b", "y")]), None);
}

// ---- counter entries ----

#[test]
fn entries_carry_the_request_values() {
    let rules = load_ok(NESTED);
    let m = find(
        &rules,
        "d",
        &[("tenant", "t1"), ("user", "u1"), ("path", "/p")],
    )
    .expect("match");
    assert_eq!(
        m.entries,
        [("tenant", "t1"), ("user", "u1"), ("path", "/p")]
    );
}

#[test]
fn wildcard_without_share_threshold_counts_each_value_apart() {
    let rules = load_ok(ORDER);
    let m = find(&rules, "d", &[("path", "/v1/orders")]).expect("match");
    assert_eq!(m.entries, [("path", "/v1/orders")]);
}

#[test]
fn share_threshold_counts_every_matching_value_as_the_pattern() {
    let rules = load_ok(
        "
        domain: d
        descriptors:
          - key: path
            value: /v1/*
            share_threshold: true
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
    );
    let first = find(&rules, "d", &[("path", "/v1/a")]).expect("match");
    let second = find(&rules, "d", &[("path", "/v1/b")]).expect("match");
    assert_eq!(first.entries, [("path", "/v1/*")]);
    assert_eq!(first.entries, second.entries);
}

#[test]
fn share_threshold_on_a_parent_shares_its_level_only() {
    let rules = load_ok(
        "
        domain: d
        descriptors:
          - key: tenant
            value: acme-*
            share_threshold: true
            descriptors:
              - key: user
                rate_limit: {unit: second, requests_per_unit: 1}
        ",
    );
    let m = find(&rules, "d", &[("tenant", "acme-eu"), ("user", "bob")]).expect("match");
    assert_eq!(m.entries, [("tenant", "acme-*"), ("user", "bob")]);
}

// ---- envoyproxy/ratelimit README examples ----

#[test]
fn readme_example_1_two_values_of_one_key() {
    let rules = load_ok(
        "
        domain: mongo_cps
        descriptors:
          - key: database
            value: users
            rate_limit: {unit: second, requests_per_unit: 500}
          - key: database
            value: default
            rate_limit: {unit: second, requests_per_unit: 500}
        ",
    );
    let users = find(&rules, "mongo_cps", &[("database", "users")]).expect("users");
    assert_eq!(
        (users.rule.id.as_str(), requests_per_unit(&users)),
        ("mongo_cps.database_users", 500)
    );
    let default = matched(&rules, "mongo_cps", &[("database", "default")]);
    assert_eq!(default.as_deref(), Some("mongo_cps.database_default"));
    assert_eq!(
        matched(&rules, "mongo_cps", &[("database", "orders")]),
        None
    );
}

const EXAMPLE_2: &str = "
    domain: messaging
    descriptors:
      # Marketing messages: 5 a day to each number.
      - key: message_type
        value: marketing
        descriptors:
          - key: to_number
            rate_limit: {unit: day, requests_per_unit: 5}
      # Any message: 100 a day to each number.
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 100}
    ";

#[test]
fn readme_example_2_nested_descriptor_limits_each_value() {
    let rules = load_ok(EXAMPLE_2);
    let marketing = [("message_type", "marketing"), ("to_number", "2061111111")];
    let m = find(&rules, "messaging", &marketing).expect("marketing");
    assert_eq!(m.rule.id, "messaging.message_type_marketing.to_number");
    assert_eq!(requests_per_unit(&m), 5);
    assert_eq!(m.entries, marketing);
}

#[test]
fn readme_example_2_top_level_default_limits_any_number() {
    let rules = load_ok(EXAMPLE_2);
    let m = find(&rules, "messaging", &[("to_number", "2062222222")]).expect("any");
    assert_eq!(
        (m.rule.id.as_str(), requests_per_unit(&m)),
        ("messaging.to_number", 100)
    );
}

#[test]
fn readme_example_2_other_message_type_is_not_limited() {
    let rules = load_ok(EXAMPLE_2);
    let entries = [
        ("message_type", "transactional"),
        ("to_number", "2061111111"),
    ];
    assert_eq!(matched(&rules, "messaging", &entries), None);
}

#[test]
fn readme_example_3_specific_value_beats_the_default() {
    let rules = load_ok(
        "
        domain: edge_proxy_per_ip
        descriptors:
          - key: remote_address
            rate_limit: {unit: second, requests_per_unit: 10}
          # This address is blocked outright.
          - key: remote_address
            value: 50.0.0.5
            rate_limit: {unit: second, requests_per_unit: 0}
        ",
    );
    let any = find(
        &rules,
        "edge_proxy_per_ip",
        &[("remote_address", "50.0.0.1")],
    )
    .expect("any");
    assert_eq!(requests_per_unit(&any), 10);
    let blocked = find(
        &rules,
        "edge_proxy_per_ip",
        &[("remote_address", "50.0.0.5")],
    )
    .expect("blocked");
    assert_eq!(requests_per_unit(&blocked), 0);
}

#[test]
fn readme_example_4_depth_must_match() {
    let flat = load_ok(
        "
        domain: example4
        descriptors:
          - key: key
            value: value
            rate_limit: {requests_per_unit: 300, unit: second}
        ",
    );
    let request = [("key", "value"), ("subkey", "subvalue")];
    assert_eq!(matched(&flat, "example4", &request), None);

    let nested = load_ok(
        "
        domain: example4
        descriptors:
          - key: key
            value: value
            descriptors:
              - key: subkey
                rate_limit: {requests_per_unit: 300, unit: second}
        ",
    );
    assert_eq!(
        matched(&nested, "example4", &request).as_deref(),
        Some("example4.key_value.subkey")
    );
}

#[test]
fn readme_example_5_unlimited_descriptor() {
    let rules = load_ok(
        "
        domain: internal
        descriptors:
          - key: ldap
            rate_limit: {unlimited: true}
          - key: azure
            rate_limit: {unit: minute, requests_per_unit: 100}
        ",
    );
    let ldap = find(&rules, "internal", &[("ldap", "any")]).expect("ldap");
    assert_eq!(ldap.rule.policy, Policy::Unlimited { name: None });
    let azure = find(&rules, "internal", &[("azure", "any")]).expect("azure");
    assert_eq!(requests_per_unit(&azure), 100);
}

#[test]
fn readme_example_6_shadow_mode_per_value() {
    let rules = load_ok(
        "
        domain: example6
        descriptors:
          - key: service
            descriptors:
              - key: user
                value: user-a
                shadow_mode: true
                rate_limit: {requests_per_unit: 10, unit: second}
              - key: user
                value: user-b
                rate_limit: {requests_per_unit: 20, unit: second}
        ",
    );
    let a = find(
        &rules,
        "example6",
        &[("service", "auth-service"), ("user", "user-a")],
    )
    .expect("a");
    assert!(a.rule.shadow_mode);
    assert_eq!(requests_per_unit(&a), 10);
    let b = find(
        &rules,
        "example6",
        &[("service", "auth-service"), ("user", "user-b")],
    )
    .expect("b");
    assert!(!b.rule.shadow_mode);
    assert_eq!(requests_per_unit(&b), 20);
    assert_eq!(
        matched(
            &rules,
            "example6",
            &[("service", "auth-service"), ("user", "user-c")]
        ),
        None
    );
}

#[test]
fn readme_example_7_replaces_names_the_limit_it_replaces() {
    let rules = load_ok(
        "
        domain: example7
        descriptors:
          - key: key_1
            value: value_1
            descriptors:
              - key: user
                value: bkthomps
                rate_limit: {name: specific_limit, requests_per_unit: 5, unit: second}
          - key: key_2
            value: value_2
            descriptors:
              - key: user
                value: bkthomps
                rate_limit:
                  replaces: [{name: specific_limit}]
                  requests_per_unit: 10
                  unit: second
        ",
    );
    let original = find(
        &rules,
        "example7",
        &[("key_1", "value_1"), ("user", "bkthomps")],
    )
    .expect("1");
    let replacing = find(
        &rules,
        "example7",
        &[("key_2", "value_2"), ("user", "bkthomps")],
    )
    .expect("2");
    assert_eq!(
        original.rule.names().collect::<Vec<_>>(),
        ["specific_limit"]
    );
    assert_eq!(requests_per_unit(&original), 5);
    assert_eq!(replacing.rule.replaces, ["specific_limit"]);
    assert_eq!(requests_per_unit(&replacing), 10);
}

#[test]
fn readme_example_8_detailed_metric_on_the_default() {
    let rules = load_ok(
        "
        domain: example8
        descriptors:
          - key: key1
            detailed_metric: true
            rate_limit: {unit: minute, requests_per_unit: 10}
          - key: key1
            value: value1
            rate_limit: {unit: minute, requests_per_unit: 20}
        ",
    );
    let unlisted = find(&rules, "example8", &[("key1", "unspecified_value")]).expect("default");
    assert!(unlisted.rule.detailed_metric);
    assert_eq!(requests_per_unit(&unlisted), 10);
    let listed = find(&rules, "example8", &[("key1", "value1")]).expect("value1");
    assert!(!listed.rule.detailed_metric);
    assert_eq!(requests_per_unit(&listed), 20);
}

#[test]
fn readme_example_9_trailing_wildcard() {
    let rules = load_ok(
        "
        domain: example9
        descriptors:
          - key: key1
            value: value*
            rate_limit: {unit: minute, requests_per_unit: 20}
        ",
    );
    for value in ["value_1", "value_2", "value"] {
        let m = find(&rules, "example9", &[("key1", value)]).expect("wildcard");
        assert_eq!(
            (m.rule.id.as_str(), requests_per_unit(&m)),
            ("example9.key1_value*", 20)
        );
        assert_eq!(m.entries, [("key1", value)]);
    }
    assert_eq!(matched(&rules, "example9", &[("key1", "other")]), None);
}

// ---- an order for entries that have none (RLQS buckets) ----

const PATH_OF_THREE: &str = "
    domain: d
    descriptors:
      - key: tenant
        descriptors:
          - key: user
            descriptors:
              - key: path
                rate_limit: {unit: second, requests_per_unit: 1}
";

fn owned(entries: &[(&str, &str)]) -> Vec<Entry> {
    (entries.iter())
        .map(|&(key, value)| Entry::new(key, value))
        .collect()
}

#[test]
fn entries_in_no_order_are_put_in_the_order_of_a_path_to_a_rule() {
    let rules = load_ok(PATH_OF_THREE);
    let domain = rules.domain("d").expect("domain loaded");
    let entries = owned(&[("path", "/"), ("tenant", "t"), ("user", "u")]);
    assert_eq!(domain.order_matching(&entries), Some(vec![1, 2, 0]));
}

#[test]
fn entries_no_order_of_which_reaches_a_rule_have_no_order() {
    let rules = load_ok(PATH_OF_THREE);
    let domain = rules.domain("d").expect("domain loaded");
    let short = owned(&[("tenant", "t"), ("user", "u")]);
    assert_eq!(domain.order_matching(&short), None, "a path above the rule");
    let stranger = owned(&[("tenant", "t"), ("user", "u"), ("path", "/"), ("x", "y")]);
    assert_eq!(
        domain.order_matching(&stranger),
        None,
        "a path past the rule"
    );
    assert_eq!(domain.order_matching(&[]), None);
}

#[test]
fn an_unmatched_bucket_is_dropped_at_the_first_level_without_trying_orders() {
    // Eight entries no level knows: eight lookups, where trying every order would be 8!.
    let rules = load_ok(PATH_OF_THREE);
    let domain = rules.domain("d").expect("domain loaded");
    let entries: Vec<Entry> = (0..8)
        .map(|i| Entry::new(format!("key{i}"), format!("value{i}")))
        .collect();
    let mut search = OrderSearch {
        entries: &entries,
        used: vec![false; entries.len()],
        order: Vec::new(),
        lookups_left: LOOKUPS_PER_ORDER_SEARCH,
    };
    assert!(!search.from(&domain.descriptors));
    assert_eq!(LOOKUPS_PER_ORDER_SEARCH - search.lookups_left, 8);
}
