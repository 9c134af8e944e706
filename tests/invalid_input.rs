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
    assert!(message.contains("no descriptors"), "{message}");
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
