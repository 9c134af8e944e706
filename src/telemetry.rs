//! OpenTelemetry traces: one span per decision, continuing the caller's trace, with a child
//! span for the backend call, exported over OTLP.
//!
//! **Configured by the standard variables**, nothing of floodgate's own:
//! - on when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set,
//!   or `OTEL_TRACES_EXPORTER=otlp`; off otherwise, and with `OTEL_TRACES_EXPORTER=none` or
//!   `OTEL_SDK_DISABLED=true`;
//! - `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`: `http/protobuf` (the default) or `grpc`; the
//!   endpoint, headers, timeout and compression variables of the OTLP exporter;
//! - `OTEL_TRACES_SAMPLER[_ARG]` (the default follows the caller's sampled flag and samples
//!   traces that start here), `OTEL_BSP_*` for batching, `OTEL_SERVICE_NAME` (default
//!   `floodgate`) and `OTEL_RESOURCE_ATTRIBUTES`;
//! - `OTEL_PROPAGATORS`: which incoming trace headers are read, of `tracecontext` (W3C
//!   `traceparent`) and `b3`/`b3multi` (Zipkin's, either form); both by default, W3C first.
//!
//! **Off costs nothing.** Without a [`Telemetry`] no span, context or header lookup exists;
//! a decision pays one branch on an `Option`.
//!
//! **Export never holds up a decision.** Ended spans queue for a batching thread
//! (`OTEL_BSP_MAX_QUEUE_SIZE`, dropped past it); the exporter's calls run on the server's
//! runtime, where the OTLP clients' connections live.

use std::time::Duration;

use ::http::{HeaderMap, HeaderName};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanData, SpanExporter};

use crate::backend::BackendError;
use crate::limiter::Decision;
use crate::metrics::Code;

/// The tracer and the propagators, while tracing is on.
pub struct Telemetry {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagators: Vec<Box<dyn TextMapPropagator + Send + Sync>>,
}

/// Why tracing cannot start as the `OTEL_*` variables ask.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TelemetryError(String);

impl Telemetry {
    /// Tracing as the `OTEL_*` variables configure it; `None` when they leave it off. Must
    /// run on the server's runtime: the exporter's connections are made on it.
    pub fn from_env() -> Result<Option<Telemetry>, TelemetryError> {
        Telemetry::from_vars(|name| std::env::var(name).ok())
    }

    fn from_vars(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Telemetry>, TelemetryError> {
        if !wanted(&var)? {
            return Ok(None);
        }
        let propagators = propagators(var("OTEL_PROPAGATORS").as_deref())?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .build()
            .map_err(|error| TelemetryError(format!("the OTLP trace exporter: {error}")))?;
        let exporter = OnRuntime {
            runtime: tokio::runtime::Handle::current(),
            exporter: std::sync::Arc::new(exporter),
        };
        let mut resource = Resource::builder();
        if var("OTEL_SERVICE_NAME").is_none() && !names_service(var("OTEL_RESOURCE_ATTRIBUTES")) {
            resource = resource.with_service_name("floodgate");
        }
        let resource = resource
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("floodgate");
        Ok(Some(Telemetry {
            provider,
            tracer,
            propagators,
        }))
    }

    /// Starts the span of a decision asked for by `rpc` (`service/method`, or the HTTP
    /// route), as a child of the trace the `headers` carry (a new trace without one).
    pub fn decision(
        &self,
        rpc: &'static str,
        headers: &HeaderMap,
        domain: &str,
        descriptors: usize,
    ) -> DecisionSpan {
        let headers = Headers(headers);
        let parent = (self.propagators.iter()).fold(Context::new(), |cx, propagator| {
            propagator.extract_with_context(&cx, &headers)
        });
        let span = (self.tracer.span_builder(rpc))
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("ratelimit.domain", domain.to_owned()),
                KeyValue::new("ratelimit.descriptors", descriptors as i64),
            ])
            .start_with_context(&self.tracer, &parent);
        DecisionSpan {
            tracer: self.tracer.clone(),
            cx: parent.with_span(span),
        }
    }

    /// Exports the spans still queued, waiting up to `timeout`; nothing is traced after.
    pub async fn shutdown(&self, timeout: Duration) {
        let provider = self.provider.clone();
        let flushed =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(timeout)).await;
        if let Ok(Err(error)) = flushed {
            tracing::warn!("exporting the last spans: {error}");
        }
    }
}

/// Whether the variables turn tracing on (see the module).
fn wanted(var: &impl Fn(&str) -> Option<String>) -> Result<bool, TelemetryError> {
    if var("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true")) {
        return Ok(false);
    }
    match var("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
        Some("none") => Ok(false),
        Some("otlp") => Ok(true),
        Some(other) => Err(TelemetryError(format!(
            "OTEL_TRACES_EXPORTER={other}: floodgate exports `otlp` or `none`"
        ))),
        None => Ok(var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
            || var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()),
    }
}

/// Whether `OTEL_RESOURCE_ATTRIBUTES` names the service itself.
fn names_service(attributes: Option<String>) -> bool {
    attributes.is_some_and(|attributes| {
        (attributes.split(',')).any(|pair| pair.trim_start().starts_with("service.name="))
    })
}

/// The propagators `OTEL_PROPAGATORS` names, in an order where W3C's wins over B3's when a
/// request carries both (each one read later overrides what an earlier one found).
fn propagators(
    names: Option<&str>,
) -> Result<Vec<Box<dyn TextMapPropagator + Send + Sync>>, TelemetryError> {
    let names = names.unwrap_or("tracecontext,b3");
    let (mut w3c, mut b3) = (false, false);
    for name in names
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
    {
        match name {
            "tracecontext" => w3c = true,
            "b3" | "b3multi" => b3 = true,
            // Baggage carries no trace; `none` asks for nothing.
            "baggage" | "none" => {}
            other => {
                return Err(TelemetryError(format!(
                    "OTEL_PROPAGATORS: `{other}` is not read; floodgate reads tracecontext, b3, \
                     b3multi"
                )));
            }
        }
    }
    let mut chosen: Vec<Box<dyn TextMapPropagator + Send + Sync>> = Vec::new();
    if b3 {
        chosen.push(Box::new(B3));
    }
    if w3c {
        chosen.push(Box::new(TraceContextPropagator::new()));
    }
    Ok(chosen)
}

/// A decision's span, with the context its children start from.
pub struct DecisionSpan {
    tracer: SdkTracer,
    cx: Context,
}

impl DecisionSpan {
    /// Starts the span of the backend call that counts `hits` counters.
    pub fn backend_call(&self, backend: &'static str, hits: usize) -> BackendSpan {
        let span = (self.tracer.span_builder("floodgate.backend.hit_all"))
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("floodgate.backend", backend),
                KeyValue::new("floodgate.hits", hits as i64),
            ])
            .start_with_context(&self.tracer, &self.cx);
        BackendSpan(span)
    }

    /// Ends the span with the decision's `outcome`.
    pub fn finish(self, outcome: Code) {
        let failed = matches!(outcome, Code::InvalidArgument | Code::Unavailable);
        self.finish_as(outcome.name(), failed);
    }

    /// Ends the span with an `outcome` named in full (a gRPC status code's name), marked as
    /// an error when the call `failed`.
    pub fn finish_as(self, outcome: &'static str, failed: bool) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("ratelimit.outcome", outcome));
        if failed {
            span.set_status(Status::error(outcome));
        }
        span.end();
    }
}

/// The span of one backend call.
pub struct BackendSpan(opentelemetry_sdk::trace::Span);

impl BackendSpan {
    /// Ends the span with the backend's `answers`: an error status, with the first error,
    /// when any hit went uncounted.
    pub fn finish(mut self, answers: &[Result<Decision, BackendError>]) {
        let mut errors = answers.iter().filter_map(|answer| answer.as_ref().err());
        if let Some(first) = errors.next() {
            let failed = 1 + errors.count();
            (self.0).set_attribute(KeyValue::new("floodgate.failed_hits", failed as i64));
            self.0.set_status(Status::error(first.to_string()));
        }
        self.0.end();
    }
}

/// Header lookups for the propagators.
struct Headers<'h>(&'h HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// Zipkin's B3 headers, read in both forms: `b3: {trace}-{span}[-{sampled}[-{parent}]]`, or
/// `x-b3-traceid`, `x-b3-spanid`, `x-b3-sampled` and `x-b3-flags`. A 64-bit trace id is
/// widened with zeros; a request that defers the sampling decision is sampled, as this is
/// the receiver it was deferred to.
#[derive(Debug)]
struct B3;

impl B3 {
    fn single(value: &str) -> Option<SpanContext> {
        let mut parts = value.split('-');
        let trace = parts.next()?;
        let span = parts.next()?;
        let sampled = match parts.next() {
            None | Some("d") | Some("1") => true,
            Some("0") => false,
            Some(_) => return None,
        };
        b3_context(trace, span, sampled)
    }

    fn multi(headers: &dyn Extractor) -> Option<SpanContext> {
        let trace = headers.get("x-b3-traceid")?;
        let span = headers.get("x-b3-spanid")?;
        let debug = headers.get("x-b3-flags") == Some("1");
        let sampled = match headers.get("x-b3-sampled") {
            None | Some("1") | Some("true") => true,
            Some("0") | Some("false") => debug,
            Some(_) => return None,
        };
        b3_context(trace, span, sampled)
    }
}

fn b3_context(trace: &str, span: &str, sampled: bool) -> Option<SpanContext> {
    let hex = |text: &str, len: usize| {
        text.len() == len && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let trace = match trace.len() {
        16 if hex(trace, 16) => TraceId::from_hex(&format!("{trace:0>32}")).ok()?,
        32 if hex(trace, 32) => TraceId::from_hex(trace).ok()?,
        _ => return None,
    };
    if !hex(span, 16) {
        return None;
    }
    let span = SpanId::from_hex(span).ok()?;
    let flags = if sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::NOT_SAMPLED
    };
    let context = SpanContext::new(trace, span, flags, true, TraceState::NONE);
    context.is_valid().then_some(context)
}

impl TextMapPropagator for B3 {
    fn inject_context(&self, cx: &Context, injector: &mut dyn Injector) {
        let span = cx.span();
        let context = span.span_context();
        if context.is_valid() {
            let sampled = if context.is_sampled() { "1" } else { "0" };
            injector.set(
                "b3",
                format!("{}-{}-{sampled}", context.trace_id(), context.span_id()),
            );
        }
    }

    fn extract_with_context(&self, cx: &Context, extractor: &dyn Extractor) -> Context {
        let found = match extractor.get("b3") {
            Some(single) => B3::single(single.trim()),
            None => B3::multi(extractor),
        };
        match found {
            Some(context) => cx.with_remote_span_context(context),
            None => cx.clone(),
        }
    }

    fn fields(&self) -> opentelemetry::propagation::text_map_propagator::FieldIter<'_> {
        opentelemetry::propagation::text_map_propagator::FieldIter::new(B3_FIELDS.as_slice())
    }
}

static B3_FIELDS: std::sync::LazyLock<[String; 5]> = std::sync::LazyLock::new(|| {
    [
        "b3",
        "x-b3-traceid",
        "x-b3-spanid",
        "x-b3-sampled",
        "x-b3-flags",
    ]
    .map(String::from)
});

/// An exporter whose calls run on the server's runtime: the batching thread that calls it
/// has none, and the OTLP clients need one for their connections and timers.
#[derive(Debug)]
struct OnRuntime<E> {
    runtime: tokio::runtime::Handle,
    exporter: std::sync::Arc<E>,
}

impl<E: SpanExporter + 'static> SpanExporter for OnRuntime<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let exporter = self.exporter.clone();
        let exported = self
            .runtime
            .spawn(async move { exporter.export(batch).await })
            .await;
        exported.unwrap_or_else(|error| {
            Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(
                error.to_string(),
            ))
        })
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.exporter.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.exporter.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        if let Some(exporter) = std::sync::Arc::get_mut(&mut self.exporter) {
            exporter.set_resource(resource);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(set: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            (set.iter())
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        }
    }

    #[test]
    fn tracing_is_on_only_when_the_variables_ask() {
        assert!(!wanted(&vars(&[])).unwrap());
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        assert!(wanted(&vars(&[endpoint])).unwrap());
        assert!(wanted(&vars(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "x")])).unwrap());
        assert!(wanted(&vars(&[("OTEL_TRACES_EXPORTER", "otlp")])).unwrap());
        assert!(!wanted(&vars(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")])).unwrap());
        assert!(!wanted(&vars(&[endpoint, ("OTEL_SDK_DISABLED", "TRUE")])).unwrap());
        let zipkin = wanted(&vars(&[("OTEL_TRACES_EXPORTER", "zipkin")]));
        assert!(zipkin.unwrap_err().to_string().contains("zipkin"));
    }

    #[test]
    fn unknown_propagators_are_refused_by_name() {
        assert_eq!(propagators(None).unwrap().len(), 2);
        assert_eq!(propagators(Some("tracecontext,baggage")).unwrap().len(), 1);
        assert_eq!(propagators(Some("none")).unwrap().len(), 0);
        let error = propagators(Some("tracecontext,xray")).unwrap_err();
        assert!(error.to_string().contains("`xray`"), "{error}");
    }

    fn extract(headers: &[(&str, &str)]) -> SpanContext {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        let cx = B3.extract_with_context(&Context::new(), &Headers(&map));
        cx.span().span_context().clone()
    }

    #[test]
    fn b3_is_read_in_both_forms() {
        let trace = "463ac35c9f6413ad48485a3953bb6124";
        let span = "a2fb4a1d1a96d312";
        let single = extract(&[("b3", &format!("{trace}-{span}-1-0020000000000001"))]);
        assert_eq!(single.trace_id().to_string(), trace);
        assert_eq!(single.span_id().to_string(), span);
        assert!(single.is_sampled() && single.is_remote());

        let multi = extract(&[
            ("x-b3-traceid", trace),
            ("x-b3-spanid", span),
            ("x-b3-sampled", "0"),
        ]);
        assert_eq!(multi.trace_id().to_string(), trace);
        assert!(!multi.is_sampled());
        let debug = extract(&[
            ("x-b3-traceid", trace),
            ("x-b3-spanid", span),
            ("x-b3-flags", "1"),
            ("x-b3-sampled", "0"),
        ]);
        assert!(debug.is_sampled(), "debug overrides the sampled flag");
    }

    #[test]
    fn b3_short_trace_ids_are_widened_and_bad_ones_ignored() {
        let short = extract(&[("b3", "48485a3953bb6124-a2fb4a1d1a96d312")]);
        assert_eq!(
            short.trace_id().to_string(),
            "000000000000000048485a3953bb6124"
        );
        assert!(short.is_sampled(), "a deferred decision is taken here");
        for bad in [
            "0",
            "48485a3953bb6124",
            "48485A3953BB6124-a2fb4a1d1a96d312",
            "48485a3953bb6124-a2fb4a1d1a96d3",
            "00000000000000000000000000000000-a2fb4a1d1a96d312",
            "48485a3953bb6124-a2fb4a1d1a96d312-x",
        ] {
            assert!(!extract(&[("b3", bad)]).is_valid(), "{bad}");
        }
    }
}
