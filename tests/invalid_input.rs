//! Malformed requests get gRPC INVALID_ARGUMENT with a message saying what is wrong, and the
//! server keeps serving.

mod harness;

use harness::{Floodgate, descriptor, request};

const RULES: &str = "
domain: api
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 3
";

async fn rejected(
    server: &Floodgate,
    req: floodgate::proto::envoy::service::ratelimit::v3::RateLimitRequest,
) -> String {
    let status = server.ask_err(req).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    status.message().to_owned()
}

#[tokio::test]
async fn empty_domain_is_invalid_argument() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let message = rejected(&server, request("", vec![descriptor(&[("user", "a")])])).await;
    assert!(message.contains("domain"), "{message}");
}

#[tokio::test]
async fn request_without_descriptors_is_invalid_argument() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let message = rejected(&server, request("api", vec![])).await;
    assert!(
        message.contains("descriptor list must not be empty"),
        "{message}"
    );
}

#[tokio::test]
async fn descriptor_without_entries_is_invalid_argument() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let message = rejected(
        &server,
        request("api", vec![descriptor(&[("user", "a")]), descriptor(&[])]),
    )
    .await;
    assert!(
        message.contains("descriptor 1") && message.contains("no entries"),
        "{message}"
    );
}

#[tokio::test]
async fn entry_with_empty_key_is_invalid_argument() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let message = rejected(
        &server,
        request("api", vec![descriptor(&[("user", "a"), ("", "b")])]),
    )
    .await;
    assert!(message.contains("entry 1 has an empty key"), "{message}");
}

#[tokio::test]
async fn too_many_descriptors_is_invalid_argument() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let many = (0..65).map(|_| descriptor(&[("user", "a")])).collect();
    let message = rejected(&server, request("api", many)).await;
    assert!(
        message.contains("65 descriptors") && message.contains("64"),
        "{message}"
    );
}

#[tokio::test]
async fn oversized_value_is_invalid_argument() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let long = "x".repeat(1025);
    let message = rejected(
        &server,
        request("api", vec![descriptor(&[("user", &long)])]),
    )
    .await;
    assert!(message.contains("1025 bytes"), "{message}");
}

#[tokio::test]
async fn request_limits_are_settings() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    drop(server);
    let dir = tempfile::tempdir().unwrap();
    let settings = dir.path().join("floodgate.toml");
    std::fs::write(&settings, "[request_limits]\nmax_entries = 1\n").unwrap();
    let server = Floodgate::start(
        &[("r.yaml", RULES)],
        &["--config", settings.to_str().unwrap()],
    );
    let message = rejected(
        &server,
        request("api", vec![descriptor(&[("user", "a"), ("b", "c")])]),
    )
    .await;
    assert!(message.contains("at most 1"), "{message}");
}

#[tokio::test]
async fn invalid_requests_do_not_disturb_valid_ones() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    rejected(&server, request("", vec![])).await;
    let response = server
        .ask(request("api", vec![descriptor(&[("user", "a")])]))
        .await;
    assert_eq!(response.statuses[0].limit_remaining, 2);
}

/// Sends `message` as the body of a `ShouldRateLimit` call, whatever bytes it holds.
async fn send_raw(server: &Floodgate, message: Vec<u8>) -> tonic::Status {
    use floodgate::proto::envoy::service::ratelimit::v3::RateLimitResponse;
    use prost::bytes::BufMut;
    use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
    use tonic::codegen::http::uri::PathAndQuery;

    /// Writes the bytes it is given, as they are.
    struct Raw;
    impl Encoder for Raw {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
            buf.put_slice(&item);
            Ok(())
        }
        fn buffer_settings(&self) -> BufferSettings {
            BufferSettings::default()
        }
    }
    struct RawCodec;
    impl Codec for RawCodec {
        type Encode = Vec<u8>;
        type Decode = RateLimitResponse;
        type Encoder = Raw;
        type Decoder = tonic_prost::ProstDecoder<RateLimitResponse>;
        fn encoder(&mut self) -> Raw {
            Raw
        }
        fn decoder(&mut self) -> Self::Decoder {
            tonic_prost::ProstDecoder::new(BufferSettings::default())
        }
    }

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc_addr))
        .expect("an endpoint")
        .connect()
        .await
        .expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let path =
        PathAndQuery::from_static("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit");
    grpc.unary(tonic::Request::new(message), path, RawCodec)
        .await
        .expect_err("an undecodable message gets no decision")
}

#[tokio::test]
async fn a_message_that_does_not_decode_is_invalid_argument_and_counted() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    // Field 1 (domain) announces 127 bytes and brings 1: truncated protobuf.
    let truncated = send_raw(&server, vec![0x0a, 0x7f, b'a']).await;
    // Field 1 (domain) holds bytes that are not UTF-8.
    let not_utf8 = send_raw(&server, vec![0x0a, 0x02, 0xff, 0xfe]).await;
    for status in [&truncated, &not_utf8] {
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains("does not decode"),
            "{}",
            status.message()
        );
    }
    let (_, page) = server.http("GET", "/metrics", "");
    assert!(
        page.contains(
            "floodgate_requests_total{protocol=\"grpc\",method=\"ShouldRateLimit\",code=\"INVALID_ARGUMENT\"} 2"
        ),
        "{page}"
    );
}

/// The largest request the default `request_limits` allow: every descriptor and entry there
/// may be, each key, value and the domain as long as they may be, every number at its widest.
fn largest_request() -> floodgate::proto::envoy::service::ratelimit::v3::RateLimitRequest {
    use floodgate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let entries: Vec<(String, String)> = (0..16)
        .map(|i| (format!("{i:0>256}"), "v".repeat(1024)))
        .collect();
    let entries: Vec<(&str, &str)> = (entries.iter())
        .map(|(key, value)| (key.as_str(), value.as_str()))
        .collect();
    let mut one = descriptor(&entries);
    one.limit = Some(RateLimitOverride {
        requests_per_unit: u32::MAX,
        unit: 4,
        // 100 years of days, the longest window allowed.
        unit_multiplier: Some(pbjson_types::UInt32Value { value: 36_500 }),
    });
    one.hits_addend = Some(pbjson_types::UInt64Value { value: u64::MAX });
    one.is_negative_hits = true;
    let mut largest = request(&"a".repeat(1024), vec![one; 64]);
    largest.hits_addend = u32::MAX;
    largest
}

#[tokio::test]
async fn a_message_past_the_largest_valid_request_is_resource_exhausted_naming_the_limit() {
    use prost::Message;
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let largest = largest_request();
    let limit = floodgate::settings::RequestLimits::default().largest_request_bytes();
    // The unit and multiplier the wire allows at their widest (a negative enum, 2^32 - 1)
    // are not valid: the largest valid request is a little smaller than the limit.
    let size = largest.encoded_len();
    assert!(size <= limit && limit - size < 64 * 16, "{size} of {limit}");
    // Decided, not refused for its size (its negative hits are more than the counter
    // has, so it answers with a rule's answer, whatever that is).
    let mut client = server.client().await;
    client
        .should_rate_limit(largest.clone())
        .await
        .expect("the largest valid request is decided");

    // One byte more, announced: refused at the header, naming the limit.
    let mut call = harness::raw_call(server.grpc_addr, &[]).await;
    let mut header = vec![0u8];
    header.extend_from_slice(&u32::try_from(limit + 1).unwrap().to_be_bytes());
    (call.body).send_data(header.into(), false).expect("data");
    let (status, message) = harness::grpc_status_and_message(&mut call.response)
        .await
        .expect("an answer");
    assert_eq!(status, (tonic::Code::ResourceExhausted as i32).to_string());
    assert!(
        message.contains(&format!("{} bytes", limit + 1)) && message.contains(&limit.to_string()),
        "{message}"
    );
    assert!(message.contains("request_limits"), "{message}");
}

#[tokio::test]
async fn a_domain_longer_than_a_value_is_invalid_argument() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let long = "d".repeat(1025);
    let message = rejected(&server, request(&long, vec![descriptor(&[("user", "a")])])).await;
    assert!(
        message.contains("domain is 1025 bytes") && message.contains("max_value_bytes"),
        "{message}"
    );
}

#[tokio::test]
async fn a_unary_call_with_a_second_message_is_invalid_argument() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let mut call = harness::raw_call(server.grpc_addr, &[]).await;
    let one = harness::grpc_frame(&request("api", vec![descriptor(&[("user", "a")])]));
    let mut two = one.to_vec();
    two.extend_from_slice(&one);
    (call.body).send_data(two.into(), true).expect("data");
    let (status, message) = harness::grpc_status_and_message(&mut call.response)
        .await
        .expect("an answer");
    assert_eq!(status, (tonic::Code::InvalidArgument as i32).to_string());
    assert!(message.contains("one message"), "{message}");
}
