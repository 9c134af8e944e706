use super::*;
use crate::limiter::{Algorithm, Limit, Unit};
use crate::rules::testing::{dedent, load, load_ok};
use crate::rules::{Entry, NamedLimit, OnBackendError, Policy, Rule};

fn errors(text: &str) -> Vec<LoadError> {
    match load(text) {
        Ok(_) => panic!("expected load errors"),
        Err(LoadErrors(errors)) => errors,
    }
}

/// Asserts the load fails with exactly one error, at `line`, for `rule`, saying `message`.
#[track_caller]
fn assert_error(text: &str, line: usize, rule: &str, message: &str) {
    let errors = errors(text);
    let rendered: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(errors.len(), 1, "expected one error, got {rendered:#?}");
    let error = &errors[0];
    assert_eq!(error.file, "rules.yaml", "{rendered:?}");
    assert_eq!(error.line, line, "{rendered:?}");
    assert_eq!(error.rule, rule, "{rendered:?}");
    assert!(
        error.message.contains(message),
        "{:?} lacks {message:?}",
        error.message
    );
}

fn rule<'a>(rules: &'a RuleSet, id: &str) -> &'a Rule {
    rules.rules().find(|rule| rule.id == id).unwrap_or_else(|| {
        panic!(
            "no rule {id}; have {:?}",
            rules.rules().map(|r| &r.id).collect::<Vec<_>>()
        )
    })
}

fn limits(rule: &Rule) -> &[NamedLimit] {
    match &rule.policy {
        Policy::Limited(limits) => limits,
        Policy::Unlimited { .. } => panic!("{} is unlimited", rule.id),
    }
}

// ---- what a successful load holds ----

#[test]
fn rule_id_joins_domain_keys_and_values_like_envoy_stats_keys() {
    let rules = load_ok(
        "
        domain: messaging
        descriptors:
          - key: message_type
            value: marketing
            descriptors:
              - key: to_number
                rate_limit: {unit: day, requests_per_unit: 5}
        ",
    );
    let ids: Vec<_> = rules.rules().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["messaging.message_type_marketing.to_number"]);
}

#[test]
fn rule_source_is_the_file_and_line_of_its_key() {
    let rules = load_ok(
        "
        domain: d
        descriptors:
          - value: v
            key: k
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
    );
    let source = &rule(&rules, "d.k_v").source;
    assert_eq!((source.file.as_str(), source.line), ("rules.yaml", 4));
}

#[test]
fn rate_limit_defaults_to_one_fixed_window_unit() {
    let rules = load_ok(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: MINUTE, requests_per_unit: 7}
        ",
    );
    let rule = rule(&rules, "d.k");
    assert_eq!(
        limits(rule),
        [NamedLimit {
            name: None,
            limit: Limit::per(7, Unit::Minute)
        }]
    );
    assert!(!rule.shadow_mode && !rule.quota_mode && !rule.share_threshold);
    assert_eq!(rule.on_backend_error, None);
    assert_eq!(rule.metadata, None);
}

#[test]
fn requests_per_unit_zero_is_a_valid_limit() {
    let rules = load_ok(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: second, requests_per_unit: 0}
        ",
    );
    assert_eq!(limits(rule(&rules, "d.k"))[0].limit.requests_per_unit, 0);
}

#[test]
fn rate_limits_holds_several_limits_with_every_extension() {
    let rules = load_ok(
        "
        domain: api
        descriptors:
          - key: user_id
            on_backend_error: local
            rate_limits:
              - unit: second
                requests_per_unit: 10
                algorithm: token_bucket
                burst: 20
                name: per_second
              - unit: day
                requests_per_unit: 1000
                timezone: Europe/Paris
              - unit: minute
                unit_multiplier: 5
                requests_per_unit: 300
                algorithm: sliding_window
        ",
    );
    let rule = rule(&rules, "api.user_id");
    let limits = limits(rule);
    assert_eq!(limits.len(), 3);
    assert_eq!(limits[0].name.as_deref(), Some("per_second"));
    assert_eq!(limits[0].limit.algorithm, Algorithm::TokenBucket);
    assert_eq!(limits[0].limit.burst, Some(20));
    assert_eq!(
        limits[1].limit.timezone.as_ref().map(|tz| tz.name()),
        Some("Europe/Paris")
    );
    assert_eq!(limits[2].limit.unit_multiplier, 5);
    assert_eq!(limits[2].limit.algorithm, Algorithm::SlidingWindow);
    assert_eq!(rule.on_backend_error, Some(OnBackendError::Local));
}

#[test]
fn every_algorithm_name_loads() {
    for algorithm in Algorithm::ALL {
        let rules = load_ok(&format!(
            "
            domain: d
            descriptors:
              - key: k
                rate_limit: {{unit: second, requests_per_unit: 1, algorithm: {}}}
            ",
            algorithm.name()
        ));
        assert_eq!(limits(rule(&rules, "d.k"))[0].limit.algorithm, algorithm);
    }
}

#[test]
fn unlimited_rule_keeps_its_name() {
    let rules = load_ok(
        "
        domain: internal
        descriptors:
          - key: ldap
            rate_limit: {unlimited: true, name: ldap_free}
        ",
    );
    let expected = Policy::Unlimited {
        name: Some("ldap_free".to_owned()),
    };
    assert_eq!(rule(&rules, "internal.ldap").policy, expected);
}

#[test]
fn replaces_lists_every_named_limit() {
    let rules = load_ok(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit:
              unit: second
              requests_per_unit: 1
              replaces: [{name: a}, {name: b}, {name: a}]
        ",
    );
    assert_eq!(rule(&rules, "d.k").replaces, ["a", "b"]);
}

#[test]
fn flags_and_metadata_are_kept_with_their_yaml_types() {
    let rules = load_ok(
        r#"
        domain: d
        descriptors:
          - key: path
            value: /v1/*
            share_threshold: true
            shadow_mode: true
            quota_mode: true
            detailed_metric: true
            value_to_metric: true
            metadata:
              team: payments
              tier: 2
              ratio: 0.5
              paid: false
              code: "2"
              none: ~
              tags: [a, 1]
              nested: {x: y}
            rate_limit: {unit: second, requests_per_unit: 1}
        "#,
    );
    let rule = rule(&rules, "d.path_/v1/*");
    assert!(rule.share_threshold && rule.shadow_mode && rule.quota_mode);
    assert!(rule.detailed_metric && rule.value_to_metric);
    let expected = serde_json::json!({
        "team": "payments", "tier": 2, "ratio": 0.5, "paid": false, "code": "2",
        "none": null, "tags": ["a", 1], "nested": {"x": "y"},
    });
    assert_eq!(
        rule.metadata.clone().map(serde_json::Value::Object),
        Some(expected)
    );
}

#[test]
fn scalar_values_are_read_as_written() {
    let rules = load_ok(
        "
        domain: d
        descriptors:
          - key: status
            value: 010
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
    );
    assert!(rules.rules().any(|r| r.id == "d.status_010"));
}

#[test]
fn node_without_limit_or_children_is_kept_as_a_whitelist() {
    let rules = load_ok(
        "
        domain: d
        descriptors:
          - key: internal
        ",
    );
    let domain = rules.domain("d").expect("domain");
    assert_eq!(domain.descriptors.nodes.len(), 1);
    assert!(domain.descriptors.nodes[0].rule.is_none());
}

#[test]
fn domain_without_descriptors_loads_empty() {
    let rules = load_ok("domain: quiet\n");
    assert!(rules.domain("quiet").is_some());
    assert_eq!(rules.rules().count(), 0);
}

// ---- errors: YAML and file shape ----

#[test]
fn bad_yaml_reports_the_parser_line() {
    let errors = errors(
        "
        domain: d
        descriptors:
          - key: [unclosed
            value: x
        ",
    );
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].rule, "(file)");
    assert!(
        errors[0].message.starts_with("invalid YAML"),
        "{}",
        errors[0]
    );
    assert!((3..=5).contains(&errors[0].line), "{}", errors[0]);
}

#[test]
fn empty_file_has_no_domain() {
    assert_error("", 1, "(file)", "no domain");
}

#[test]
fn comment_only_file_has_no_domain() {
    assert_error("\n# nothing here yet\n# really\n", 1, "(file)", "no domain");
}

#[test]
fn second_yaml_document_is_an_error() {
    assert_error(
        "\ndomain: a\n---\ndomain: b\n",
        3,
        "(file)",
        "one YAML document",
    );
}

#[test]
fn file_that_is_not_a_map_is_an_error() {
    assert_error("\n- domain: d\n", 1, "(file)", "must be a map, got a list");
}

#[test]
fn missing_domain_is_an_error() {
    assert_error(
        "
        descriptors:
          - key: k
        ",
        1,
        "(file)",
        "no domain",
    );
}

#[test]
fn empty_domain_is_an_error() {
    assert_error("\ndomain: ''\n", 1, "(file)", "empty domain");
}

#[test]
fn duplicate_domain_across_files_names_both() {
    let sources = [
        ("a.yaml".to_owned(), "domain: api\n".to_owned()),
        ("b.yaml".to_owned(), "# second\ndomain: api\n".to_owned()),
    ];
    let errors = RuleSet::from_sources(&sources).expect_err("duplicate").0;
    assert_eq!(errors.len(), 1);
    assert_eq!((errors[0].file.as_str(), errors[0].line), ("b.yaml", 2));
    assert_eq!(errors[0].rule, "domain api");
    assert!(
        errors[0].message.contains("duplicate domain"),
        "{}",
        errors[0]
    );
    assert!(errors[0].message.contains("a.yaml:1"), "{}", errors[0]);
}

/// Two files of one domain, as `merge_domain_config` loads them from (name, text) pairs.
fn merged(sources: &[(&str, &str)]) -> Result<RuleSet, LoadErrors> {
    let sources: Vec<(String, String)> = (sources.iter())
        .map(|(name, text)| (name.to_string(), text.to_string()))
        .collect();
    super::load(&sources, Vec::new(), true)
}

#[test]
fn merged_files_of_one_domain_add_their_descriptors_and_each_decides() {
    let rules = merged(&[
        ("a.yaml", "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"),
        ("b.yaml", "domain: api\ndescriptors:\n  - key: path\n    value: /v1\n    rate_limit: {unit: hour, requests_per_unit: 7}\n"),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rules.domains.len(), 1);
    let api = &rules.domains["api"];
    let (alice, v1) = ([Entry::new("user", "alice")], [Entry::new("path", "/v1")]);
    let user = api.find(&alice).expect("a.yaml's rule");
    assert_eq!(user.rule.id, "api.user");
    assert_eq!(user.rule.source.file, "a.yaml");
    let path = api.find(&v1).expect("b.yaml's rule");
    assert_eq!(path.rule.id, "api.path_/v1");
    assert_eq!(path.rule.source.file, "b.yaml");
}

#[test]
fn merged_files_that_define_one_descriptor_twice_name_both_places() {
    let errors = merged(&[
        ("a.yaml", "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"),
        ("b.yaml", "domain: api\ndescriptors:\n  - key: other\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 7}\n"),
    ])
    .expect_err("a descriptor twice")
    .0;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!((errors[0].file.as_str(), errors[0].line), ("b.yaml", 4));
    assert_eq!(errors[0].rule, "domain api > user");
    assert!(errors[0].message.contains("a.yaml:3"), "{}", errors[0]);
}

#[test]
fn without_merging_a_domain_in_two_files_points_at_the_setting() {
    let sources = [
        ("a.yaml".to_owned(), "domain: api\n".to_owned()),
        ("b.yaml".to_owned(), "domain: api\n".to_owned()),
    ];
    let errors = RuleSet::from_sources(&sources).expect_err("duplicate").0;
    assert!(
        errors[0].message.contains("merge_domain_config"),
        "{}",
        errors[0]
    );
}

#[test]
fn unknown_top_level_key_names_it_and_lists_the_valid_ones() {
    assert_error(
        "
        domain: d
        descriptor: []
        ",
        2,
        "domain d",
        "unknown key `descriptor` in the rule file; valid keys: domain, descriptors",
    );
}

#[test]
fn descriptors_that_are_not_a_list_are_an_error() {
    assert_error(
        "\ndomain: d\ndescriptors: {key: k}\n",
        2,
        "domain d",
        "descriptors: expected a list, got a map",
    );
}

// ---- errors: descriptors ----

#[test]
fn unknown_descriptor_key_names_it_and_lists_the_valid_ones() {
    let errors = errors(
        "
        domain: d
        descriptors:
          - key: k
            value: v
            ratelimit: {unit: second, requests_per_unit: 1}
        ",
    );
    assert_eq!(errors.len(), 1);
    assert_eq!(
        (errors[0].line, errors[0].rule.as_str()),
        (5, "domain d > k=v")
    );
    let message = &errors[0].message;
    assert!(
        message.contains("unknown key `ratelimit` in descriptor"),
        "{message}"
    );
    assert!(
        message.contains("key, value, rate_limit, rate_limits, descriptors"),
        "{message}"
    );
}

#[test]
fn duplicate_yaml_key_is_an_error_at_its_line() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit:
              unit: second
              requests_per_unit: 1
              unit: minute
        ",
        7,
        "domain d > k",
        "duplicate key `unit` in rate_limit",
    );
}

#[test]
fn missing_key_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - value: v
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
        3,
        "domain d > ?=v",
        "missing key",
    );
}

#[test]
fn empty_key_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: ''
        ",
        3,
        "domain d > ?",
        "empty key",
    );
}

#[test]
fn descriptor_that_is_not_a_map_is_an_error() {
    assert_error(
        "\ndomain: d\ndescriptors:\n  - just_a_string\n",
        3,
        "domain d > ?",
        "descriptor must be a map",
    );
}

#[test]
fn duplicate_descriptor_with_same_key_and_value_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            value: v
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: k
            value: v
            rate_limit: {unit: second, requests_per_unit: 2}
        ",
        6,
        "domain d > k=v",
        "duplicate descriptor: key `k` with value `v`",
    );
}

#[test]
fn duplicate_key_only_default_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: parent
            descriptors:
              - key: k
              - key: k
        ",
        6,
        "domain d > parent > k",
        "duplicate descriptor: key `k` without a value",
    );
}

#[test]
fn same_descriptor_under_different_parents_is_not_a_duplicate() {
    load_ok(
        "
        domain: d
        descriptors:
          - key: a
            descriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]
          - key: b
            descriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]
        ",
    );
}

#[test]
fn descriptors_sharing_an_id_are_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: a
            value: b
          - key: a_b
        ",
        5,
        "domain d > a_b",
        "descriptor id `d.a_b` is also the id",
    );
}

#[test]
fn wrong_boolean_is_a_type_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            shadow_mode: 'yes'
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
        4,
        "domain d > k",
        "shadow_mode: expected true or false, got the string `yes`",
    );
}

#[test]
fn yaml_1_1_booleans_are_read_as_envoyproxy_ratelimit_reads_them() {
    let rules = RuleSet::from_sources(&[(
        "a.yaml".into(),
        "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes\n    quota_mode: Off\n    \
         rate_limit: {unit: second, requests_per_unit: 1}\n"
            .into(),
    )])
    .unwrap();
    let rule = rules.rules().next().unwrap();
    assert!(rule.shadow_mode);
    assert!(!rule.quota_mode);
}

#[test]
fn share_threshold_without_wildcard_value_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: path
            value: /exact
            share_threshold: true
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
        5,
        "domain d > path=/exact",
        "share_threshold applies only to a wildcard value",
    );
}

#[test]
fn unknown_on_backend_error_lists_the_policies() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            on_backend_error: retry
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
        4,
        "domain d > k",
        "unknown policy `retry`; valid policies: error, fail_open, fail_closed, local",
    );
}

#[test]
fn on_backend_error_without_a_rate_limit_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            on_backend_error: fail_open
        ",
        4,
        "domain d > k",
        "on_backend_error applies to a descriptor with rate_limit",
    );
}

#[test]
fn metadata_that_is_not_a_map_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            metadata: [a, b]
            rate_limit: {unit: second, requests_per_unit: 1}
        ",
        4,
        "domain d > k",
        "metadata: expected a map, got a list",
    );
}

// ---- errors: rate limits ----

#[test]
fn requests_per_unit_as_text_is_a_type_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit:
              unit: second
              requests_per_unit: ten
        ",
        6,
        "domain d > k",
        "rate_limit.requests_per_unit: expected an integer from 0 to 4294967295, got the string `ten`",
    );
}

#[test]
fn negative_requests_per_unit_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: second, requests_per_unit: -1}
        ",
        4,
        "domain d > k",
        "expected an integer from 0 to 4294967295, got `-1`",
    );
}

#[test]
fn requests_per_unit_above_u32_max_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: second, requests_per_unit: 4294967296}
        ",
        4,
        "domain d > k",
        "got `4294967296`",
    );
}

#[test]
fn missing_requests_per_unit_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit:
              unit: second
        ",
        5,
        "domain d > k",
        "rate_limit: missing `requests_per_unit`",
    );
}

#[test]
fn missing_unit_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit:
              requests_per_unit: 5
        ",
        5,
        "domain d > k",
        "rate_limit: missing `unit`",
    );
}

#[test]
fn unknown_unit_lists_the_valid_ones() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: fortnight, requests_per_unit: 5}
        ",
        4,
        "domain d > k",
        "unknown unit `fortnight`; valid units: second, minute, hour, day, week, month, year",
    );
}

#[test]
fn unlimited_with_a_unit_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit:
              unlimited: true
              unit: second
        ",
        6,
        "domain d > k",
        "`unit` cannot be combined with `unlimited: true`",
    );
}

#[test]
fn unlimited_with_requests_per_unit_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit: {unlimited: true, requests_per_unit: 5}
        ",
        4,
        "domain d > k",
        "`requests_per_unit` cannot be combined with `unlimited: true`",
    );
}

#[test]
fn replaces_naming_its_own_limit_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit:
              name: mine
              unit: second
              requests_per_unit: 1
              replaces:
                - name: mine
        ",
        9,
        "domain d > k",
        "replaces `mine`, the name of this rule's own limit",
    );
}

#[test]
fn replaces_naming_a_sibling_limit_of_rate_limits_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limits:
              - {name: fast, unit: second, requests_per_unit: 1}
              - {unit: day, requests_per_unit: 9, replaces: [{name: fast}]}
        ",
        6,
        "domain d > k",
        "replaces `fast`",
    );
}

#[test]
fn empty_replaces_name_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit:
              unit: second
              requests_per_unit: 1
              replaces:
                - name: ''
        ",
        8,
        "domain d > k",
        "rate_limit.replaces[0]: empty name",
    );
}

#[test]
fn rate_limit_and_rate_limits_together_are_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: second, requests_per_unit: 1}
            rate_limits: [{unit: day, requests_per_unit: 9}]
        ",
        5,
        "domain d > k",
        "either rate_limit (one limit) or rate_limits (a list), not both",
    );
}

#[test]
fn empty_rate_limits_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limits: []
        ",
        4,
        "domain d > k",
        "rate_limits: expected at least one limit",
    );
}

#[test]
fn unlimited_inside_rate_limits_is_an_unknown_key() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limits:
              - unit: second
                requests_per_unit: 1
                unlimited: true
        ",
        7,
        "domain d > k",
        "unknown key `unlimited` in rate_limits[0]",
    );
}

#[test]
fn unknown_algorithm_lists_the_valid_ones() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky_bucket}
        ",
        4,
        "domain d > k",
        "valid algorithms: fixed_window, sliding_window, sliding_log, token_bucket, gcra",
    );
}

#[test]
fn burst_on_fixed_window_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit:
              unit: second
              requests_per_unit: 1
              burst: 5
        ",
        7,
        "domain d > k",
        "burst applies to token_bucket and gcra only, not fixed_window",
    );
}

#[test]
fn burst_zero_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra, burst: 0}
        ",
        4,
        "domain d > k",
        "rate_limit.burst: expected an integer from 1 to 4294967295",
    );
}

#[test]
fn unit_multiplier_zero_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 0}
        ",
        4,
        "domain d > k",
        "rate_limit.unit_multiplier: expected an integer from 1",
    );
}

#[test]
fn timezone_on_sliding_window_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit:
              unit: day
              requests_per_unit: 1
              algorithm: sliding_window
              timezone: Europe/Paris
        ",
        8,
        "domain d > k",
        "timezone: applies to fixed_window only",
    );
}

#[test]
fn timezone_on_hour_unit_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: hour, requests_per_unit: 1, timezone: Europe/Paris}
        ",
        4,
        "domain d > k",
        "applies to unit day, week, month or year, not hour",
    );
}

#[test]
fn timezone_with_unit_multiplier_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: day, unit_multiplier: 2, requests_per_unit: 1, timezone: UTC}
        ",
        4,
        "domain d > k",
        "applies to unit_multiplier 1 only",
    );
}

#[test]
fn unknown_timezone_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: day, requests_per_unit: 1, timezone: Mars/Olympus_Mons}
        ",
        4,
        "domain d > k",
        "rate_limit.timezone: unknown time zone",
    );
}

#[test]
fn rate_limits_errors_name_the_element() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limits:
              - {unit: second, requests_per_unit: 1}
              - {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: -2}
        ",
        6,
        "domain d > k",
        "rate_limits[1].burst",
    );
}

// ---- errors: collected, all or nothing ----

#[test]
fn every_error_of_every_file_is_reported() {
    let sources = [
        (
            "a.yaml".to_owned(),
            dedent(
                "
                domain: a
                descriptors:
                  - key: k
                    rate_limit: {unit: eon, requests_per_unit: 1}
                  - key: j
                    bogus: 1
                    descriptors:
                      - key: deep
                        rate_limit: {unit: second, requests_per_unit: many}
                ",
            ),
        ),
        ("b.yaml".to_owned(), "domain: [".to_owned()),
        ("c.yaml".to_owned(), "domain: c\n".to_owned()),
    ];
    let errors = RuleSet::from_sources(&sources).expect_err("errors").0;
    let found: Vec<_> = errors
        .iter()
        .map(|e| (e.file.as_str(), e.line, e.rule.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            ("a.yaml", 4, "domain a > k"),
            ("a.yaml", 6, "domain a > j"),
            ("a.yaml", 9, "domain a > j > deep"),
            ("b.yaml", 1, "(file)"),
        ],
        "{}",
        LoadErrors(errors.clone())
    );
}

#[test]
fn load_error_display_is_file_line_rule_message() {
    let error = LoadError {
        file: "rules/api.yaml".to_owned(),
        line: 12,
        rule: "domain api > user_id".to_owned(),
        message: "missing key".to_owned(),
    };
    assert_eq!(
        error.to_string(),
        "rules/api.yaml:12: domain api > user_id: missing key"
    );
}

// ---- load_dir ----

#[test]
fn load_dir_reads_yaml_files_sorted_and_skips_hidden_and_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let write =
        |name: &str, text: &str| std::fs::write(dir.path().join(name), text).expect("write");
    write("b.yml", "domain: b\n");
    write("a.yaml", "domain: a\n");
    write(".hidden.yaml", "domain: a\n");
    write("notes.txt", "not yaml");
    std::fs::create_dir(dir.path().join("..data")).expect("mkdir");
    std::fs::write(dir.path().join("..data/a.yaml"), "domain: a\n").expect("write");
    std::fs::create_dir(dir.path().join("nested")).expect("mkdir");
    std::fs::write(dir.path().join("nested/c.yaml"), "domain: [").expect("write");

    let rules =
        RuleSet::load_dir(dir.path(), DEFAULT_RULES_MAX_BYTES).unwrap_or_else(|e| panic!("{e}"));
    let domains: Vec<_> = rules.domains.keys().map(String::as_str).collect();
    assert_eq!(domains, ["a", "b"]);
}

/// The layout kubelet gives a ConfigMap volume: the data in a timestamped directory,
/// `..data` pointing at it, and each file a symbolic link through `..data`.
#[cfg(unix)]
#[test]
fn load_dir_reads_a_configmap_volume_once_through_its_file_links() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("..2026_11_22_10_00_00.000000001");
    std::fs::create_dir(&data).expect("mkdir");
    std::fs::write(data.join("api.yaml"), "domain: api\n").expect("write");
    std::fs::write(data.join("web.yml"), "domain: web\n").expect("write");
    symlink(data.file_name().expect("name"), dir.path().join("..data")).expect("symlink");
    for name in ["api.yaml", "web.yml"] {
        symlink(format!("..data/{name}"), dir.path().join(name)).expect("symlink");
    }

    let rules =
        RuleSet::load_dir(dir.path(), DEFAULT_RULES_MAX_BYTES).unwrap_or_else(|e| panic!("{e}"));
    let domains: Vec<_> = rules.domains.keys().map(String::as_str).collect();
    assert_eq!(domains, ["api", "web"]);
    assert_eq!(
        rules.domains["api"].source.file,
        dir.path().join("api.yaml").display().to_string()
    );
}

#[test]
fn rule_files_read_equal_until_a_rule_file_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.yaml"), "domain: a\n").expect("write");
    let before = RuleFiles::read(dir.path(), DEFAULT_RULES_MAX_BYTES);
    std::fs::write(dir.path().join(".log"), "not a rule file").expect("write");
    assert_eq!(RuleFiles::read(dir.path(), DEFAULT_RULES_MAX_BYTES), before);
    std::fs::write(dir.path().join("a.yaml"), "domain: b\n").expect("write");
    assert_ne!(RuleFiles::read(dir.path(), DEFAULT_RULES_MAX_BYTES), before);
}

#[test]
fn load_dir_names_files_by_path_in_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("bad.yaml"), "domain: ''\n").expect("write");
    let errors = RuleSet::load_dir(dir.path(), DEFAULT_RULES_MAX_BYTES)
        .expect_err("bad")
        .0;
    assert_eq!(
        errors[0].file,
        dir.path().join("bad.yaml").display().to_string()
    );
}

#[test]
fn missing_rules_directory_is_an_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope");
    let errors = RuleSet::load_dir(&missing, DEFAULT_RULES_MAX_BYTES)
        .expect_err("missing")
        .0;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].file, missing.display().to_string());
    assert!(
        errors[0]
            .message
            .contains("cannot read the rules directory"),
        "{}",
        errors[0]
    );
}

#[test]
fn example_rules_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/rules");
    let rules = RuleSet::load_dir(&dir, DEFAULT_RULES_MAX_BYTES).unwrap_or_else(|e| panic!("{e}"));
    assert!(rules.domain("edge").is_some());
    assert!(rules.domain("floodgate_demo").is_some());
    assert!(rules.rules().count() >= 10);
}

// ---- dump ----

#[test]
fn dump_lists_every_rule_with_every_limit_parameter() {
    let rules = load_ok(
        "
        domain: api
        descriptors:
          - key: user
            shadow_mode: true
            rate_limits:
              - {unit: second, requests_per_unit: 10, algorithm: gcra, burst: 20, name: fast}
              - {unit: day, requests_per_unit: 1000, timezone: UTC}
          - key: ldap
            rate_limit: {unlimited: true}
        ",
    );
    assert_eq!(
        rules.dump(),
        "# rules from rule files\n\
         api.user: {unit=second, unit_multiplier=1, requests_per_unit=10, algorithm=gcra, burst=20, \
         timezone=none, name=fast} {unit=day, unit_multiplier=1, requests_per_unit=1000, \
         algorithm=fixed_window, burst=none, timezone=UTC, name=none}, shadow_mode=true, quota_mode=false\n\
         api.ldap: {unlimited, name=none}, shadow_mode=false, quota_mode=false\n"
    );
}

#[test]
fn dump_is_stable_across_loads() {
    let text = "
        domain: z
        descriptors:
          - {key: b, rate_limit: {unit: second, requests_per_unit: 1}}
          - {key: a, value: '*', rate_limit: {unit: second, requests_per_unit: 2}}
        ";
    let sources = |first: &str, second: &str| {
        vec![
            (first.to_owned(), dedent(text)),
            (second.to_owned(), "domain: y\ndescriptors: [{key: k, rate_limit: {unit: hour, requests_per_unit: 3}}]\n".to_owned()),
        ]
    };
    let one = RuleSet::from_sources(&sources("1.yaml", "2.yaml"))
        .expect("loads")
        .dump();
    let two = RuleSet::from_sources(&sources("1.yaml", "2.yaml"))
        .expect("loads")
        .dump();
    assert_eq!(one, two);
    assert!(one.starts_with("# rules from rule files\ny.k: "), "{one}");
}

#[test]
fn window_longer_than_a_century_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: year, unit_multiplier: 101, requests_per_unit: 1}
        ",
        4,
        "domain d > k",
        "longer than 100 years",
    );
}

#[test]
fn bucket_that_takes_a_century_to_refill_is_an_error() {
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: year, requests_per_unit: 1, algorithm: gcra, burst: 101}
        ",
        4,
        "domain d > k",
        "longer than 100 years",
    );
}

#[test]
fn descriptors_nested_past_the_bound_are_an_error_at_their_line() {
    // Each descriptor level is a map inside a `descriptors:` list: two levels of YAML.
    let mut text = String::from("domain: deep\n");
    for level in 0..60 {
        let indent = "  ".repeat(2 * level);
        text += &format!("{indent}descriptors:\n{indent}  - key: k{level}\n");
    }
    let errors = errors(&text);
    assert_eq!(errors.len(), 1, "{errors:?}");
    // The 100th level of nesting is the map of the 50th descriptor (k49), written on its
    // key's line: line 2 + 2 × 49 + 1.
    assert_eq!((errors[0].line, errors[0].rule.as_str()), (101, "(file)"));
    assert!(
        errors[0].message.contains("nests at most 100"),
        "{}",
        errors[0]
    );
}

#[test]
fn rule_files_past_the_byte_bound_together_are_errors_naming_each() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = "domain: a\n";
    std::fs::write(dir.path().join("a.yaml"), a).expect("write");
    std::fs::write(dir.path().join("b.yaml"), "domain: b\n").expect("write");
    let bound = 2 * a.len() as u64;
    assert!(RuleSet::load_dir(dir.path(), bound).is_ok());
    let errors = RuleSet::load_dir(dir.path(), bound - 1)
        .expect_err("too big")
        .0;
    assert_eq!(errors.len(), 1, "{errors:?}");
    let b = dir.path().join("b.yaml").display().to_string();
    assert_eq!((errors[0].file.as_str(), errors[0].line), (b.as_str(), 0));
    assert!(
        errors[0]
            .message
            .contains("reach 20 bytes with this one (10 bytes)")
            && errors[0].message.contains("rules_max_bytes (19)"),
        "{}",
        errors[0]
    );
}

#[test]
fn overshoot_counts_every_charge_of_the_limit_it_is_set_on() {
    let rules = load_ok(
        "
        domain: llm
        descriptors:
          - key: tenant
            rate_limits:
              - {unit: hour, requests_per_unit: 1000, algorithm: token_bucket, overshoot: true}
              - {unit: day, requests_per_unit: 5000}
        ",
    );
    let limits = limits(rule(&rules, "llm.tenant"));
    assert!(limits[0].limit.overshoot);
    assert!(!limits[1].limit.overshoot);
    assert!(
        rules.dump().contains("name=none, overshoot=true}"),
        "{}",
        rules.dump()
    );
}

#[test]
fn overshoot_goes_with_every_algorithm() {
    for algorithm in Algorithm::ALL {
        let rules = load_ok(&format!(
            "
            domain: llm
            descriptors:
              - key: tenant
                rate_limit: {{unit: hour, requests_per_unit: 10, algorithm: {}, overshoot: true}}
            ",
            algorithm.name()
        ));
        let limits = limits(rule(&rules, "llm.tenant"));
        assert_eq!(limits[0].limit.algorithm, algorithm);
        assert!(limits[0].limit.overshoot, "{}", algorithm.name());
    }
}

#[test]
fn overshoot_is_a_counting_key_and_no_partner_for_unlimited() {
    assert_error(
        "
        domain: llm
        descriptors:
          - key: tenant
            rate_limit: {unlimited: true, overshoot: true}
        ",
        4,
        "domain llm > tenant",
        "`overshoot` cannot be combined with `unlimited: true`",
    );
}

#[test]
fn lease_goes_with_fixed_window_and_token_bucket() {
    let rules = load_ok(
        "
        domain: api
        descriptors:
          - key: tenant
            rate_limits:
              - {unit: hour, requests_per_unit: 200, lease: true}
              - {unit: second, requests_per_unit: 50, algorithm: token_bucket, lease: true}
              - {unit: day, requests_per_unit: 5000}
        ",
    );
    let limits = limits(rule(&rules, "api.tenant"));
    let leased: Vec<bool> = limits.iter().map(|named| named.limit.lease).collect();
    assert_eq!(leased, [true, true, false]);
    assert!(
        rules.dump().contains("name=none, lease=true}"),
        "{}",
        rules.dump()
    );
}

#[test]
fn lease_is_refused_where_a_block_cannot_be_exact() {
    let refused = [
        ("sliding_log", "sliding_log cannot lease"),
        ("sliding_window", "sliding_window does not lease"),
        (
            "gcra",
            "gcra does not lease; token_bucket with the same burst",
        ),
    ];
    for (algorithm, message) in refused {
        assert_error(
            &format!(
                "
                domain: d
                descriptors:
                  - key: k
                    rate_limit:
                      unit: second
                      requests_per_unit: 1
                      algorithm: {algorithm}
                      lease: true
                "
            ),
            8,
            "domain d > k",
            message,
        );
    }
    assert_error(
        "
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: second, requests_per_unit: 1, overshoot: true, lease: true}
        ",
        4,
        "domain d > k",
        "lease cannot be combined with overshoot",
    );
}
