//! The typed client against a real floodgate: decisions, quota, costs and refused requests.

mod common;

use std::time::Duration;

use common::{DOMAIN, Floodgate};
use floodgate_client::{Descriptor, Error, Limit, Unit};

fn user(name: &str) -> Descriptor {
    Descriptor::new().entry("user_id", name)
}

#[tokio::test]
async fn allowed_up_to_the_limit_then_rejected() {
    let server = Floodgate::start(&[]);
    let client = server.client().await;

    for call in 1..=3 {
        let decision = client
            .should_rate_limit(DOMAIN, &[user("alice")], 1)
            .await
            .unwrap();
        assert!(decision.allowed, "call {call} is within 3 per hour");
        assert!(!decision.degraded);
    }
    let decision = client
        .should_rate_limit(DOMAIN, &[user("alice")], 1)
        .await
        .unwrap();
    assert!(!decision.allowed, "the fourth call is over 3 per hour");
    assert!(!decision.statuses[0].allowed);
    assert!(!decision.degraded);
}

#[tokio::test]
async fn reports_the_limit_the_remaining_quota_and_the_reset() {
    let server = Floodgate::start(&[]);
    let client = server.client().await;

    let first = client
        .should_rate_limit(DOMAIN, &[user("bob")], 1)
        .await
        .unwrap();
    let second = client
        .should_rate_limit(DOMAIN, &[user("bob")], 1)
        .await
        .unwrap();

    let limit = Limit {
        name: Some("user_per_hour".into()),
        requests_per_unit: 3,
        unit: Unit::Hour,
        unit_multiplier: 1,
    };
    assert_eq!(first.statuses[0].limit, Some(limit));
    assert_eq!(first.statuses[0].remaining, 2);
    assert_eq!(second.statuses[0].remaining, 1);
    let reset = second.statuses[0].reset;
    assert!(
        reset > Duration::ZERO && reset <= Duration::from_secs(3600),
        "a fixed hourly window resets within the hour, not after {reset:?}"
    );
}

#[tokio::test]
async fn answers_one_status_per_descriptor_in_request_order() {
    let server = Floodgate::start(&[]);
    let client = server.client().await;
    let plan = Descriptor::from_iter([("plan", "free")]);
    let unmatched = Descriptor::new().entry("colour", "blue");

    client
        .should_rate_limit(DOMAIN, &[user("carol")], 3)
        .await
        .unwrap();
    let decision = client
        .should_rate_limit(DOMAIN, &[plan, user("carol"), unmatched], 1)
        .await
        .unwrap();

    assert!(
        !decision.allowed,
        "one descriptor over limit rejects the request"
    );
    let [plan, carol, unmatched] = decision.statuses.as_slice() else {
        panic!("three statuses expected, got {:?}", decision.statuses);
    };
    assert!(plan.allowed);
    assert_eq!(plan.remaining, 99);
    let plan_limit = plan.limit.as_ref().expect("the plan rule matched");
    assert_eq!(
        (plan_limit.unit, plan_limit.unit_multiplier),
        (Unit::Minute, 5)
    );
    assert!(!carol.allowed);
    assert!(unmatched.allowed);
    assert_eq!(unmatched.limit, None, "no rule matches colour");
}

#[tokio::test]
async fn hits_cost_more_than_one_and_a_descriptor_can_override_them() {
    let server = Floodgate::start(&[]);
    let client = server.client().await;
    let tenant = |name: &str| Descriptor::new().entry("tenant", name);

    let decision = client
        .should_rate_limit(DOMAIN, &[tenant("acme")], 4)
        .await
        .unwrap();
    assert_eq!(decision.statuses[0].remaining, 6, "10 a day, 4 taken");

    let decision = client
        .should_rate_limit(DOMAIN, &[tenant("acme").hits(5), tenant("globex")], 2)
        .await
        .unwrap();
    assert_eq!(
        decision.statuses[0].remaining, 1,
        "the descriptor's own 5 beat the call's 2"
    );
    assert_eq!(decision.statuses[1].remaining, 8, "the call's 2");

    let decision = client
        .should_rate_limit(DOMAIN, &[tenant("acme")], 2)
        .await
        .unwrap();
    assert!(!decision.allowed, "2 more than the 1 left");
    assert_eq!(
        decision.statuses[0].remaining, 1,
        "a rejected hit is not counted"
    );
}

#[tokio::test]
async fn a_refused_request_is_an_invalid_argument_error() {
    let server = Floodgate::start(&[]);
    let client = server.client().await;

    let empty_key = Descriptor::new().entry("", "x");
    let error = client
        .should_rate_limit(DOMAIN, &[empty_key], 1)
        .await
        .expect_err("an empty key is refused");

    let Error::InvalidArgument(message) = error else {
        panic!("expected InvalidArgument, got {error:?}");
    };
    assert!(
        message.contains("empty key"),
        "the server's reason is kept: {message}"
    );
    assert_eq!(
        server.calls_answered("INVALID_ARGUMENT"),
        1,
        "a refused request is not retried"
    );
}

#[tokio::test]
async fn returns_the_headers_the_server_asks_for() {
    let server = Floodgate::start(&["--response-headers", "ietf"]);
    let client = server.client().await;

    let decision = client
        .should_rate_limit(DOMAIN, &[user("dave")], 1)
        .await
        .unwrap();
    let names: Vec<&str> = decision
        .headers
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(names, ["ratelimit-policy", "ratelimit"]);

    client
        .should_rate_limit(DOMAIN, &[user("dave")], 2)
        .await
        .unwrap();
    let rejected = client
        .should_rate_limit(DOMAIN, &[user("dave")], 1)
        .await
        .unwrap();
    assert!(
        rejected
            .headers
            .iter()
            .any(|(name, _)| name == "retry-after"),
        "over limit adds Retry-After: {:?}",
        rejected.headers
    );
}
