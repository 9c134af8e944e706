//! The `floodgate` command: `serve` (the default), `check-config`, `query`, `bench` (the
//! `floodgate-bench` binary beside it), and
//! `ratelimit` (envoyproxy/ratelimit's environment; also the binary started as `ratelimit`).

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use floodgate::backend::{Backend, MemoryBackend};
use floodgate::clock::SystemClock;
use floodgate::edge::tls::{Protocols, ServerTls};
use floodgate::reload::{Hangups, Reloader};
use floodgate::rules::{DEFAULT_RULES_MAX_BYTES, Origin, RuleFiles, RuleSet};
use floodgate::server;
use floodgate::server::{AdminEndpoint, Endpoints, GrpcEndpoint, Readiness, RunningServer};
use floodgate::service::{RateLimiter, ServiceOptions};
use floodgate::settings::{BackendKind, HeaderStyle, LogFormat, Overrides, RulesSource, Settings};
use floodgate::telemetry::Telemetry;
use floodgate::xds::Subscription;

mod compat;
mod counters_cli;
mod query;

/// mimalloc: the h2/tonic request path allocates many small, short-lived buffers, which
/// glibc's allocator serves markedly slower (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "floodgate",
    version = floodgate::LONG_VERSION,
    about = "A gRPC rate-limit decision service for Envoy and microservices"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve rate-limit decisions over gRPC and HTTP (the default).
    #[command(after_help = SETTINGS_WITHOUT_FLAGS)]
    Serve(ServeArgs),
    /// Load a rules directory and report every error; exit 1 if there is any.
    CheckConfig {
        /// The rules directory.
        dir: PathBuf,
        /// The most bytes the rule files may hold together, as the server's setting.
        #[arg(long, env = "FLOODGATE_RULES_MAX_BYTES", default_value_t = DEFAULT_RULES_MAX_BYTES)]
        rules_max_bytes: u64,
        /// Merge the files of one domain, as the server's setting.
        #[arg(long, env = "FLOODGATE_MERGE_DOMAIN_CONFIG")]
        merge_domain_config: bool,
    },
    /// Ask a running server for one decision and print it; exit 0 when allowed, 3 when over
    /// limit, 1 without a decision (2 is a usage error).
    Query(query::QueryArgs),
    /// Load-test a running server over gRPC and report throughput and latency: runs
    /// `floodgate-bench`, installed beside this binary, with the same arguments (`floodgate
    /// bench --help` is its help).
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Serve with envoyproxy/ratelimit's environment variables (also what the binary does
    /// when started as `ratelimit`, the image's /bin/ratelimit).
    Ratelimit {
        /// Print what each of upstream's variables set here becomes (honoured, or not and
        /// why) and the settings they make, then exit.
        #[arg(long)]
        explain: bool,
    },
    /// Read or reset a descriptor's counters through a server's admin API.
    #[command(subcommand)]
    Counters(counters_cli::CountersCommand),
    /// Print the shell completion script for `shell`, e.g.
    /// `floodgate completions bash > /etc/bash_completion.d/floodgate`.
    Completions { shell: clap_complete::Shell },
}

/// What `serve --help` says of the settings that have no flag.
const SETTINGS_WITHOUT_FLAGS: &str = "\
More settings have no flag: set them in the --config file (TOML) or as FLOODGATE_* variables
(a section's dot becomes a double underscore: grpc_tls.cert_file is FLOODGATE_GRPC_TLS__CERT_FILE).
  grpc_tls.{cert_file,key_file,client_ca_file,reload_interval_ms}   TLS and mutual TLS on gRPC
  grpc_unix_socket                     gRPC on a Unix socket instead of grpc_addr
  metrics_addr                         /metrics on a port of its own
  statsd.{addr,protocol,flush_interval_ms,extra_tags,format,mogrifiers}
                                       upstream's stats to a statsd (or DogStatsD) server
  admin_addr, admin_token, admin_tls.* the admin API (counters: get, reset)
  rules_source = \"xds\", xds.{server_url,node_id,node_cluster,ca_file,cert_file,key_file,
    server_name,overlays_file,max_message_bytes,...}   rules over xDS
  rules_max_bytes                      the most bytes of rules (files or an xDS snapshot)
  merge_domain_config                  rule files of one domain add up instead of clashing
  redis_username, redis_password, redis_tls_ca_file, redis_tls_cert_file,
    redis_tls_key_file, redis_pool_size, redis_connect_timeout_ms,
    redis_command_timeout_ms, redis_max_wait_ms, redis_key_prefix, redis_breaker_failures,
    redis_breaker_window_ms, redis_breaker_cooldown_ms, redis_local_cache_size   Redis
  redis_startup.{max_elapsed_ms,initial_interval_ms,max_interval_ms}
                                       wait for Redis at start, or exit past the bound
  redis_per_second.{backend,url,username,password,sentinel_master,pool_size}
                                       a second Redis for per-second limits' counters
  readiness_follows_backend            /readyz and gRPC health follow Redis' breaker
  readiness_needs_rules                unready while no rule is loaded
  metrics_response_time_in_milliseconds   upstream's response-time histogram in ms
  memory_max_counters, rlqs_max_remembered_bytes, near_limit_ratio, on_backend_error,
    request_limits.*, connection_limits.*, shutdown_grace   limits and policies
  OTEL_EXPORTER_OTLP_ENDPOINT (and the other OTEL_* variables)   traces over OTLP
docs/settings.md describes every one; `floodgate ratelimit` reads
envoyproxy/ratelimit's environment variables instead.";

/// Every flag is also a settings-file key and a `FLOODGATE_*` environment variable.
#[derive(Args, Default)]
struct ServeArgs {
    /// Settings file (TOML): every setting, those without a flag included (below).
    #[arg(long, env = "FLOODGATE_CONFIG")]
    config: Option<PathBuf>,
    /// Directory of rule files [default: examples/rules].
    #[arg(long)]
    rules: Option<PathBuf>,
    /// Milliseconds between looks at the rules directory for changes; 0: reload only on
    /// SIGHUP [default: 1000].
    #[arg(long)]
    rules_reload_interval_ms: Option<u64>,
    /// gRPC listen address [default: 127.0.0.1:8081].
    #[arg(long)]
    grpc_addr: Option<String>,
    /// HTTP listen address [default: 127.0.0.1:8080].
    #[arg(long)]
    http_addr: Option<String>,
    /// Where counters live [default: memory].
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// Redis URL for the redis backend, or seed URLs (comma-separated) for redis-cluster, or
    /// sentinel URLs (comma-separated) for redis-sentinel [default: redis://127.0.0.1:6379].
    #[arg(long)]
    redis_url: Option<String>,
    /// The name the sentinels monitor the primary under, for redis-sentinel
    /// [default: mymaster].
    #[arg(long)]
    redis_sentinel_master: Option<String>,
    /// Global shadow mode: never answer OVER_LIMIT overall.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    shadow_mode: Option<bool>,
    /// Global quota mode: every rule is a soft (quota-mode) limit.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    quota_mode: Option<bool>,
    /// Whether a rejected request still counts its allowed descriptors [default: true];
    /// false: an OVER_LIMIT request consumes nothing.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    consume_on_reject: Option<bool>,
    /// Rate-limit headers to add to responses [default: none].
    #[arg(long, value_enum)]
    response_headers: Option<HeaderStyle>,
    /// Up to this many random seconds added to Retry-After [default: 0].
    #[arg(long)]
    retry_after_jitter: Option<u32>,
    /// Fill dynamic_metadata in responses.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    dynamic_metadata: Option<bool>,
    /// Log format [default: text]; the level comes from RUST_LOG (default info).
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
}

impl ServeArgs {
    fn settings(&self) -> anyhow::Result<Settings> {
        let mut overrides = Overrides::default();
        overrides.set(
            "rules",
            self.rules.as_ref().map(|p| p.display().to_string()),
        );
        overrides.set("rules_reload_interval_ms", self.rules_reload_interval_ms);
        overrides.set("grpc_addr", self.grpc_addr.clone());
        overrides.set("http_addr", self.http_addr.clone());
        overrides.set("backend", self.backend.map(BackendKind::name));
        overrides.set("redis_url", self.redis_url.clone());
        overrides.set("redis_sentinel_master", self.redis_sentinel_master.clone());
        overrides.set("shadow_mode", self.shadow_mode);
        overrides.set("quota_mode", self.quota_mode);
        overrides.set("consume_on_reject", self.consume_on_reject);
        overrides.set(
            "response_headers",
            self.response_headers.map(|h| match h {
                HeaderStyle::None => "none",
                HeaderStyle::Draft03 => "draft03",
                HeaderStyle::Ietf => "ietf",
            }),
        );
        overrides.set("retry_after_jitter", self.retry_after_jitter.map(u64::from));
        overrides.set("dynamic_metadata", self.dynamic_metadata);
        overrides.set(
            "log_format",
            self.log_format.map(|f| match f {
                LogFormat::Text => "text",
                LogFormat::Json => "json",
            }),
        );
        Settings::load(self.config.as_deref(), overrides).context("reading settings")
    }
}

fn main() -> ExitCode {
    // Started as upstream's binary: upstream's environment, and no arguments (it takes none).
    let program = std::env::args_os().next().map(PathBuf::from);
    if program.as_deref().and_then(|p| p.file_name()) == Some("ratelimit".as_ref()) {
        return serve_upstream_environment().map_or_else(report, |()| ExitCode::SUCCESS);
    }
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Serve(ServeArgs::default())) {
        Command::Serve(args) => args.settings().and_then(|settings| {
            init_logging(settings.log_format, "info");
            serve_and_leave(settings)
        }),
        Command::Ratelimit { explain: true } => explain_upstream_environment(),
        Command::Ratelimit { explain: false } => serve_upstream_environment(),
        Command::Counters(command) => {
            runtime().and_then(|rt| rt.block_on(counters_cli::run(command)))
        }
        Command::CheckConfig {
            dir,
            rules_max_bytes,
            merge_domain_config,
        } => return check_config(&dir, rules_max_bytes, merge_domain_config),
        Command::Query(args) => {
            return runtime()
                .and_then(|rt| rt.block_on(query::run(args)))
                .unwrap_or_else(report);
        }
        Command::Bench { args } => bench(&args),
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "floodgate", &mut std::io::stdout());
            Ok(())
        }
    };
    result.map_or_else(report, |()| ExitCode::SUCCESS)
}

fn report(error: anyhow::Error) -> ExitCode {
    eprintln!("floodgate: {error:#}");
    ExitCode::FAILURE
}

/// Serves until shutdown, then leaves without waiting for work the server gave up on: a
/// lookup of the statsd host whose DNS never answers runs on one of the runtime's blocking
/// threads, which dropping the runtime would wait for, however long the resolver takes.
fn serve_and_leave(settings: Settings) -> anyhow::Result<()> {
    let runtime = runtime()?;
    let served = runtime.block_on(serve(settings));
    runtime.shutdown_timeout(LEFT_BEHIND);
    served
}

/// Runs the load generator, `floodgate-bench` beside this binary, in this process' place.
fn bench(args: &[std::ffi::OsString]) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let me = std::env::current_exe().context("finding this binary")?;
    let generator = me.with_file_name("floodgate-bench");
    let error = std::process::Command::new(&generator).args(args).exec();
    Err(error).with_context(|| {
        format!(
            "running the load generator {} (installed beside floodgate by `cargo install` and \
             `cargo build`; not in the container image)",
            generator.display()
        )
    })
}

/// How long work the server gave up on may still run at exit.
const LEFT_BEHIND: Duration = Duration::from_millis(200);

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Serves with envoyproxy/ratelimit's environment variables read as settings
/// (`compat.rs`), under any `FLOODGATE_*` ones.
fn serve_upstream_environment() -> anyhow::Result<()> {
    let env: HashMap<String, String> = std::env::vars().collect();
    let translated = compat::translate(&env)?;
    let level = match translated.log_level.as_str() {
        "fatal" | "panic" => "error",
        level => level,
    };
    let layered = translated.env.into_iter().chain(env);
    let settings =
        Settings::load_from(None, layered, Overrides::default()).context("reading settings")?;
    init_logging(settings.log_format, level);
    for ignored in &translated.ignored {
        tracing::warn!("envoyproxy/ratelimit setting not honoured: {ignored}");
    }
    for (name, value) in &translated.otel {
        // SAFETY: no other thread runs yet (the runtime starts below), so nothing reads the
        // environment while it changes.
        unsafe { std::env::set_var(name, value) };
    }
    serve_and_leave(settings)
}

/// `floodgate ratelimit --explain`: upstream's variables set in the environment, honoured
/// or not (with why), and the settings they become (secrets masked).
fn explain_upstream_environment() -> anyhow::Result<()> {
    let env: HashMap<String, String> = std::env::vars().collect();
    let translated = compat::translate(&env)?;
    println!("honoured:");
    for name in &translated.honoured {
        println!("  {name}");
    }
    println!("not honoured:");
    for ignored in &translated.ignored {
        println!("  {ignored}");
    }
    println!("settings:");
    for (name, value) in &translated.env {
        let secret = name.ends_with("PASSWORD") || name.ends_with("TOKEN");
        let value = if secret { "****" } else { value };
        println!("  {name}={value}");
    }
    for (name, value) in &translated.otel {
        println!("  {name}={value}");
    }
    Ok(())
}

/// Logs at the level `RUST_LOG` names, or `default`.
fn init_logging(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn check_config(dir: &std::path::Path, max_bytes: u64, merge_domains: bool) -> ExitCode {
    match RuleFiles::read(dir, max_bytes)
        .merging_domains(merge_domains)
        .load()
    {
        Ok(rules) => {
            println!(
                "{}: {} domains, {} rules, no errors",
                dir.display(),
                rules.domains.len(),
                rules.rules().count()
            );
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            ExitCode::FAILURE
        }
    }
}

/// Serves until SIGINT or SIGTERM: the rules, the counters, the rate limiter over both, the
/// listeners, then the graceful shutdown.
async fn serve(settings: Settings) -> anyhow::Result<()> {
    raise_open_files_limit();
    let (rules, rule_files) = initial_rules(&settings)?;
    let (backend, memory) = counters(&settings).await?;
    let mut signals = ShutdownSignals::register()?;
    let hangups = Hangups::register().context("registering SIGHUP")?;
    let limiter = rate_limiter(&settings, rules, backend, memory)?;
    if settings.rules_source == RulesSource::Xds
        && !subscribe_xds(&settings, &limiter, &mut signals).await?
    {
        return Ok(());
    }
    let served_rules = limiter.rules();
    let reloader = rule_files.map(|files| {
        Reloader::new(
            &settings.rules,
            settings.rules_max_bytes,
            files,
            limiter.clone(),
        )
    });
    let endpoints = endpoints(&settings)?;
    let _statsd = spawn_statsd(&settings, &limiter);
    let readiness = readiness(&settings);
    let running = server::start(
        limiter.clone(),
        endpoints,
        settings.connection_limits,
        readiness,
    )
    .await?;
    reload_rules(&settings, reloader, hangups);
    announce(&settings, &running, &served_rules);
    run(running, signals, &settings, &limiter).await
}

/// Every client connection is a file descriptor: takes all the kernel allows.
fn raise_open_files_limit() {
    match floodgate::edge::listener::raise_open_files_limit() {
        Ok((before, after)) if after > before => {
            tracing::info!(before, after, "raised the open files limit");
        }
        Ok(_) => {}
        Err(error) => tracing::warn!("could not raise the open files limit: {error}"),
    }
}

/// The rules to start with, and the files they were read from. The files are what later
/// reloads compare the directory with. Rules over xDS start empty, and wait for the server's
/// first snapshot.
fn initial_rules(settings: &Settings) -> anyhow::Result<(RuleSet, Option<RuleFiles>)> {
    match settings.rules_source {
        RulesSource::Files => {
            let files = RuleFiles::read(&settings.rules, settings.rules_max_bytes)
                .merging_domains(settings.merge_domain_config);
            let rules = files
                .load()
                .with_context(|| format!("loading rules from {}", settings.rules.display()))?;
            Ok((rules, Some(files)))
        }
        RulesSource::Xds => {
            let origin = Origin::AwaitingXds {
                server: settings.xds.server_url.clone(),
            };
            let rules = RuleSet {
                origin,
                ..RuleSet::default()
            };
            Ok((rules, None))
        }
    }
}

/// The in-memory counters, swept every 10 seconds, and the backend the settings name
/// (which may be those same counters).
async fn counters(settings: &Settings) -> anyhow::Result<(Backend, Arc<MemoryBackend>)> {
    let clock = Arc::new(SystemClock);
    let memory = Arc::new(MemoryBackend::new(
        clock.clone(),
        settings.memory_max_counters,
    ));
    memory.spawn_sweeper(Duration::from_secs(10));
    let backend = Backend::from_settings(settings, clock, &memory).await?;
    Ok((backend, memory))
}

/// The rate limiter over `rules` and `backend`, tracing its decisions when the `OTEL_*`
/// variables ask for it.
fn rate_limiter(
    settings: &Settings,
    rules: RuleSet,
    backend: Backend,
    memory: Arc<MemoryBackend>,
) -> anyhow::Result<Arc<RateLimiter>> {
    let telemetry = Telemetry::from_env()?;
    if telemetry.is_some() {
        tracing::info!("tracing decisions, exported over OTLP as the OTEL_* variables say");
    }
    let options = ServiceOptions::from_settings(settings);
    let limiter = RateLimiter::new(rules, backend, memory, options).with_telemetry(telemetry);
    Ok(Arc::new(limiter))
}

/// Subscribes `limiter` to the rules of the xDS server and, unless
/// `xds.start_without_initial_config`, waits for the first of them; `false` when SIGINT or
/// SIGTERM came first.
async fn subscribe_xds(
    settings: &Settings,
    limiter: &Arc<RateLimiter>,
    signals: &mut ShutdownSignals,
) -> anyhow::Result<bool> {
    let subscription = Subscription::new(
        settings.xds.clone(),
        settings.rules_max_bytes,
        limiter.clone(),
    )
    .map_err(|error| anyhow::anyhow!("xds.overlays_file: {error}"))?;
    let (_, first) = subscription.spawn();
    if settings.xds.start_without_initial_config {
        return Ok(true);
    }
    tracing::info!(
        server = %settings.xds.server_url,
        "waiting for the first rules from the xDS server before serving"
    );
    tokio::select! {
        _ = first.arrived() => Ok(true),
        () = signals.received() => Ok(false),
    }
}

/// Where the settings ask the server to listen, with the TLS files they name read.
fn endpoints(settings: &Settings) -> anyhow::Result<Endpoints> {
    let grpc = GrpcEndpoint {
        addr: settings.grpc_addr,
        unix_socket: settings.grpc_unix_socket.clone(),
        tls: ServerTls::load("grpc_tls", &settings.grpc_tls, Protocols::Grpc)?,
    };
    Ok(Endpoints {
        grpc,
        http: settings.http_addr,
        metrics: settings.metrics_addr,
        admin: admin_endpoint(settings)?,
    })
}

/// Sends upstream's stats to `statsd.addr`, if set, until the process exits.
fn spawn_statsd(
    settings: &Settings,
    limiter: &Arc<RateLimiter>,
) -> Option<tokio::task::JoinHandle<()>> {
    let limiter = limiter.clone();
    floodgate::metrics::statsd::spawn(&settings.statsd, move || {
        let local_cache = limiter.backend().over_limit_counts();
        limiter.metrics().statsd_report(local_cache)
    })
}

/// What readiness follows besides serving: the backend's breaker with
/// `readiness_follows_backend`, the rules being loaded with `readiness_needs_rules`.
fn readiness(settings: &Settings) -> Readiness {
    Readiness {
        follows_backend: settings.readiness_follows_backend,
        needs_rules: settings.readiness_needs_rules,
    }
}
// Reloads rules read from files when the directory changes and on SIGHUP.
fn reload_rules(settings: &Settings, reloader: Option<Reloader>, hangups: Hangups) {
    let reload_interval = (settings.rules_reload_interval_ms > 0)
        .then(|| Duration::from_millis(settings.rules_reload_interval_ms));
    match reloader {
        Some(reloader) => drop(reloader.spawn(reload_interval, hangups)),
        // Rules over xDS change when the server says; SIGHUP has nothing to reload.
        None => drop(hangups),
    }
}

/// Logs that the server serves `rules`, and tells the console where and how to try it.
fn announce(settings: &Settings, running: &RunningServer, rules: &RuleSet) {
    tracing::info!(
        grpc = %running.grpc_addr,
        http = %running.http_addr,
        backend = settings.backend.name(),
        rules = rules.rules().count(),
        rules_source = %rules.origin,
        "floodgate serving"
    );
    let metrics = (running.metrics_addr).map_or(String::new(), |addr| format!(" metrics={addr}"));
    let admin = (running.admin_addr).map_or(String::new(), |addr| format!(" admin={addr}"));
    let grpc = (running.grpc_addr).client_address(settings.grpc_tls.cert_file.is_some());
    let suggestion = match rules.example() {
        Some((domain, entries)) => {
            let pairs: Vec<String> = (entries.iter())
                .map(|entry| format!("{}={}", entry.key, entry.value))
                .collect();
            let body = serde_json::json!({
                "domain": domain,
                "descriptors": [{
                    "entries": (entries.iter())
                        .map(|entry| serde_json::json!({"key": entry.key, "value": entry.value}))
                        .collect::<Vec<_>>(),
                }],
            });
            format!(
                "try: floodgate query --addr {grpc} --domain {} --descriptor {}\n\
                 or:  curl -s -X POST http://{}/json -d {}",
                shell_word(domain),
                shell_word(&pairs.join(",")),
                running.http_addr,
                shell_word(&body.to_string()),
            )
        }
        None => "no rule is loaded yet: nothing to try".into(),
    };
    // Written with errors ignored: a closed stdout (`floodgate serve | head -1`, a log
    // shipper gone) must not take the server down.
    let _ = writeln!(
        std::io::stdout().lock(),
        "floodgate listening: grpc={} http={}{metrics}{admin}\n{suggestion}",
        running.grpc_addr,
        running.http_addr,
    );
}

/// `text` as one shell word: as it is when it holds nothing a shell reads, else in single
/// quotes (a quote inside written `'\''`).
fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:=,@%+".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        return text.to_owned();
    }
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// Serves until a listener fails or SIGINT or SIGTERM comes, then shuts down within
/// `shutdown_grace` and exports the spans still queued.
async fn run(
    mut running: RunningServer,
    mut signals: ShutdownSignals,
    settings: &Settings,
    limiter: &RateLimiter,
) -> anyhow::Result<()> {
    tokio::select! {
        result = running.wait() => return Ok(result?),
        () = signals.received() => {}
    }
    tracing::info!("shutting down: health NOT_SERVING, finishing in-flight requests");
    let stopped = running
        .shutdown(Duration::from_secs(settings.shutdown_grace))
        .await;
    if let Some(telemetry) = limiter.telemetry() {
        telemetry.shutdown(TRACE_FLUSH_TIMEOUT).await;
    }
    Ok(stopped?)
}

/// How long the spans still queued at shutdown may take to export.
const TRACE_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The admin API the settings ask for, never open: a token, mutual TLS, or both required.
fn admin_endpoint(settings: &Settings) -> anyhow::Result<Option<AdminEndpoint>> {
    let Some(addr) = settings.admin_addr else {
        return Ok(None);
    };
    let token = (settings.admin_token.clone()).filter(|token| !token.expose().is_empty());
    let tls = ServerTls::load("admin_tls", &settings.admin_tls, Protocols::Http)?;
    if token.is_none() && settings.admin_tls.client_ca_file.is_none() {
        anyhow::bail!(
            "admin_addr needs admin_token, admin_tls.client_ca_file (mutual TLS), or both: \
             the admin API is never open"
        );
    }
    Ok(Some(AdminEndpoint { addr, token, tls }))
}

/// SIGINT and SIGTERM, registered when created: a signal that arrives before anyone waits
/// still counts (without this, a SIGTERM right after start-up would kill the process).
struct ShutdownSignals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    fn register() -> anyhow::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(ShutdownSignals {
                interrupt: signal(SignalKind::interrupt()).context("registering SIGINT")?,
                terminate: signal(SignalKind::terminate()).context("registering SIGTERM")?,
            })
        }
        #[cfg(not(unix))]
        Ok(ShutdownSignals {})
    }

    /// Resolves on the first SIGINT or SIGTERM.
    async fn received(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_over_xds_start_empty_awaiting_the_server() {
        let mut settings = Settings {
            rules_source: RulesSource::Xds,
            ..Settings::default()
        };
        settings.xds.server_url = "http://xds.example:18000".into();
        let (rules, files) = initial_rules(&settings).expect("no files to read");
        assert_eq!(rules.rules().count(), 0);
        assert_eq!(
            rules.origin,
            Origin::AwaitingXds {
                server: "http://xds.example:18000".into()
            }
        );
        assert!(files.is_none(), "nothing to reload");
    }

    #[test]
    fn an_admin_api_without_a_token_or_a_client_ca_is_refused() {
        let settings = Settings {
            admin_addr: Some("127.0.0.1:0".parse().expect("an address")),
            ..Settings::default()
        };
        let Err(error) = endpoints(&settings) else {
            panic!("an open admin API was accepted");
        };
        assert!(
            error
                .to_string()
                .starts_with("admin_addr needs admin_token"),
            "{error}"
        );
    }
}
