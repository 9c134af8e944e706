//! An OTLP trace receiver for the tests: `opentelemetry.proto.collector.trace.v1.TraceService`
//! over gRPC and `POST /v1/traces` (protobuf) over HTTP, each on a free loopback port. It
//! keeps every span it receives, with its service's name, for the test to wait on.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::sync::Notify;

/// A span as received, with the `service.name` of the resource that sent it.
#[derive(Debug, Clone)]
pub struct Received {
    pub service: String,
    pub span: Span,
}

impl Received {
    pub fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }

    pub fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }

    pub fn parent_span_id(&self) -> String {
        hex(&self.span.parent_span_id)
    }

    /// A string or integer attribute, as text.
    pub fn attribute(&self, key: &str) -> Option<String> {
        value(&self.span.attributes, key)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn value(attributes: &[KeyValue], key: &str) -> Option<String> {
    let found = attributes.iter().find(|attribute| attribute.key == key)?;
    match found.value.as_ref()?.value.as_ref()? {
        Value::StringValue(text) => Some(text.clone()),
        Value::IntValue(number) => Some(number.to_string()),
        Value::BoolValue(flag) => Some(flag.to_string()),
        other => Some(format!("{other:?}")),
    }
}

#[derive(Default)]
struct Spans {
    received: Mutex<Vec<Received>>,
    arrived: Notify,
}

impl Spans {
    fn take(&self, request: ExportTraceServiceRequest) {
        let mut received = self.received.lock().expect("spans");
        for resource in request.resource_spans {
            let attributes = resource.resource.map(|r| r.attributes).unwrap_or_default();
            let service = value(&attributes, "service.name").unwrap_or_default();
            for scope in resource.scope_spans {
                received.extend(scope.spans.into_iter().map(|span| Received {
                    service: service.clone(),
                    span,
                }));
            }
        }
        self.arrived.notify_waiters();
    }
}

/// The receiver, serving until dropped.
pub struct Collector {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    spans: Arc<Spans>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

struct Grpc(Arc<Spans>);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.take(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    /// Starts both receivers on free ports (within a Tokio runtime).
    pub async fn start() -> Collector {
        let spans = Arc::new(Spans::default());
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port for OTLP/gRPC");
        let http = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port for OTLP/HTTP");
        let (grpc_addr, http_addr) = (grpc.local_addr().unwrap(), http.local_addr().unwrap());
        let service = TraceServiceServer::new(Grpc(spans.clone()));
        let grpc_task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(grpc))
                .await
                .expect("the OTLP/gRPC receiver");
        });
        let received = spans.clone();
        let router = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: Bytes| async move {
                match ExportTraceServiceRequest::decode(body) {
                    Ok(request) => {
                        received.take(request);
                        let answer = ExportTraceServiceResponse::default().encode_to_vec();
                        (
                            axum::http::StatusCode::OK,
                            [("content-type", "application/x-protobuf")],
                            answer,
                        )
                    }
                    Err(_) => (
                        axum::http::StatusCode::BAD_REQUEST,
                        [("content-type", "text/plain")],
                        b"not an ExportTraceServiceRequest".to_vec(),
                    ),
                }
            }),
        );
        let http_task = tokio::spawn(async move {
            axum::serve(http, router)
                .await
                .expect("the OTLP/HTTP receiver");
        });
        Collector {
            grpc_addr,
            http_addr,
            spans,
            tasks: vec![grpc_task, http_task],
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Received> {
        self.spans.received.lock().expect("spans").clone()
    }

    /// Waits (up to 20 s) until the spans received include all that `wanted` needs: it
    /// answers them once they are there.
    pub async fn wait_for<T>(&self, mut wanted: impl FnMut(&[Received]) -> Option<T>) -> T {
        let waited = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let arrived = self.spans.arrived.notified();
                if let Some(found) = wanted(&self.spans()) {
                    return found;
                }
                // A notification may be missed between the look and the wait; look again
                // at least every 100 ms.
                let _ = tokio::time::timeout(Duration::from_millis(100), arrived).await;
            }
        });
        waited.await.unwrap_or_else(|_| {
            let seen: Vec<String> = (self.spans().iter())
                .map(|span| format!("{} {} {}", span.service, span.span.name, span.trace_id()))
                .collect();
            panic!("the spans waited for never arrived; received: {seen:#?}")
        })
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
