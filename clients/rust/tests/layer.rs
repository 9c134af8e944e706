//! The tower layer on a real axum router, served on a loopback port and hit with real HTTP
//! requests, in front of a real floodgate.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use common::{DOMAIN, Floodgate};
use floodgate_client::{Client, Descriptor, FailureMode, RateLimitLayer};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::Endpoint;

/// An app whose one route answers "hello" and counts its calls, limited per `x-user-id`
/// header; requests without one are not limited.
struct App {
    addr: SocketAddr,
    calls: Arc<AtomicUsize>,
}

impl App {
    async fn serve(client: Client) -> App {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let handler = move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { "hello" }
        };
        let limit = RateLimitLayer::new(client, DOMAIN, |request: &Request<Body>| {
            let user = request.headers().get("x-user-id")?.to_str().ok()?;
            Some(vec![Descriptor::new().entry("user_id", user)])
        });
        let router = Router::new().route("/", get(handler)).layer(limit);
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("bound");
        tokio::spawn(async move { axum::serve(listener, router).await });
        App { addr, calls }
    }

    /// `GET /` over a new HTTP/1.1 connection, as `user` when given.
    async fn get(&self, user: Option<&str>) -> Response<Incoming> {
        let stream = TcpStream::connect(self.addr)
            .await
            .expect("the app accepts");
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("HTTP/1.1 handshake");
        tokio::spawn(connection);
        let mut request = Request::get("/").header("host", "localhost");
        if let Some(user) = user {
            request = request.header("x-user-id", user);
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .expect("a valid request");
        sender.send_request(request).await.expect("a response")
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

async fn body(response: Response<Incoming>) -> Bytes {
    response
        .into_body()
        .collect()
        .await
        .expect("the body")
        .to_bytes()
}

/// A client of a floodgate that ran and is now stopped.
fn client_of_stopped_server(mode: FailureMode) -> Client {
    let mut server = Floodgate::start(&[]);
    server.stop();
    let channel = Endpoint::from_shared(server.url())
        .expect("a valid URL")
        .connect_lazy();
    Client::new(channel).failure_mode(mode)
}

#[tokio::test]
async fn over_limit_answers_429_with_floodgate_headers_without_calling_the_service() {
    let server = Floodgate::start(&["--response-headers", "ietf"]);
    let app = App::serve(server.client().await).await;

    for call in 1..=3 {
        let response = app.get(Some("frank")).await;
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "call {call} is within 3 per hour"
        );
        assert!(response.headers().contains_key("ratelimit-policy"));
        assert!(response.headers().contains_key("ratelimit"));
        assert_eq!(body(response).await, "hello");
    }
    let response = app.get(Some("frank")).await;

    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let headers = response.headers();
    assert!(headers.contains_key("ratelimit-policy") && headers.contains_key("ratelimit"));
    let retry_after: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(
        retry_after <= 3600,
        "within the hourly window: {retry_after}"
    );
    assert_eq!(
        app.calls(),
        3,
        "the rejected request never reached the handler"
    );
}

#[tokio::test]
async fn requests_without_descriptors_are_not_limited() {
    let server = Floodgate::start(&["--response-headers", "ietf"]);
    let app = App::serve(server.client().await).await;

    for _ in 0..5 {
        let response = app.get(None).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(
            !response.headers().contains_key("ratelimit"),
            "floodgate was not asked"
        );
    }
    assert_eq!(app.calls(), 5);
}

#[tokio::test]
async fn descriptors_the_server_refuses_answer_400() {
    let server = Floodgate::start(&[]);
    let app = App::serve(server.client().await).await;
    let too_long = "x".repeat(2000);

    let response = app.get(Some(&too_long)).await;

    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(app.calls(), 0);
}

#[tokio::test]
async fn fail_open_lets_requests_through_while_floodgate_is_down() {
    let app = App::serve(client_of_stopped_server(FailureMode::Open)).await;

    let response = app.get(Some("grace")).await;

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body(response).await, "hello");
    assert_eq!(app.calls(), 1);
}

#[tokio::test]
async fn fail_closed_answers_429_while_floodgate_is_down() {
    let app = App::serve(client_of_stopped_server(FailureMode::Closed)).await;

    let response = app.get(Some("heidi")).await;

    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        !response.headers().contains_key("retry-after"),
        "no quota is known"
    );
    assert_eq!(app.calls(), 0);
}

#[tokio::test]
async fn a_limiter_pointed_at_a_server_without_the_service_answers_500() {
    let server = Floodgate::start(&[]);
    let channel = Endpoint::from_shared(format!("http://{}", server.http_addr))
        .expect("a valid URL")
        .connect_lazy();
    let client = Client::new(channel).timeout(std::time::Duration::from_secs(5));
    let app = App::serve(client).await;

    let response = app.get(Some("ivan")).await;

    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        app.calls(),
        0,
        "neither let through nor refused as over limit"
    );
}
