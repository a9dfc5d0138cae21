//! The `cks-autoscaler-provider` binary: parses the arguments, binds the listeners the flags
//! name and turns SIGTERM/Ctrl-C into the shutdown the service waits for. Errors that end the
//! process are logged in the `--log-format` asked for, command-line errors included.

use anyhow::Context;
use cks_autoscaler_provider::app::{App, init_tracing};
use cks_autoscaler_provider::cli::{Command, LogFormat, ServeArgs, parse_args};
use std::ffi::OsString;
use std::process::ExitCode;
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let cli = match parse_args(argv.clone()) {
        Ok(cli) => cli,
        Err(e) => return command_line_error(e, &argv),
    };
    init_tracing(cli.log_format, "info");
    let format = cli.log_format;
    let result = match cli.command {
        Command::Serve(args) => serve(*args).await,
        Command::Probe(args) => cks_autoscaler_provider::probe::run(args).await,
        Command::Check(args) => cks_autoscaler_provider::check::run(*args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report_error(format, &format!("{e:#}"));
            ExitCode::FAILURE
        }
    }
}

/// A command line that does not parse. `--help` and `--version` print as clap prints them;
/// an error is printed by clap, or logged as JSON when the command line or the environment
/// asks for `--log-format json` (it did not parse, so it is read from the raw arguments).
fn command_line_error(e: clap::Error, argv: &[OsString]) -> ExitCode {
    use clap::error::ErrorKind;
    let informational = matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if informational || requested_log_format(argv) != Some(LogFormat::Json) {
        e.exit();
    }
    init_tracing(LogFormat::Json, "info");
    let text = e.to_string();
    let text = text.trim();
    report_error(
        LogFormat::Json,
        text.strip_prefix("error: ").unwrap_or(text),
    );
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
}

/// The `--log-format` of a command line that did not parse: its last `--log-format VALUE` or
/// `--log-format=VALUE`, else `CKS_PROVIDER_LOG_FORMAT`.
fn requested_log_format(argv: &[OsString]) -> Option<LogFormat> {
    let args: Vec<&str> = argv.iter().skip(1).filter_map(|a| a.to_str()).collect();
    let mut value = std::env::var("CKS_PROVIDER_LOG_FORMAT").ok();
    for (i, arg) in args.iter().enumerate() {
        if *arg == "--" {
            break;
        }
        if *arg == "--log-format" {
            value = args.get(i + 1).map(|v| v.to_string());
        } else if let Some(v) = arg.strip_prefix("--log-format=") {
            value = Some(v.to_string());
        }
    }
    match value.as_deref() {
        Some("json") => Some(LogFormat::Json),
        Some("text") => Some(LogFormat::Text),
        _ => None,
    }
}

/// The error that ends the process: one JSON log line through the subscriber with
/// `--log-format json` (printed as the subscriber would when the `RUST_LOG` filter drops
/// errors: it must be seen), else `error: …` on stderr.
fn report_error(format: LogFormat, message: &str) {
    match format {
        LogFormat::Json if tracing::enabled!(tracing::Level::ERROR) => {
            tracing::error!("{message}");
        }
        LogFormat::Json => {
            let line = serde_json::json!({
                "level": "ERROR",
                "fields": { "message": message },
                "target": module_path!(),
            });
            eprintln!("{line}");
        }
        LogFormat::Text => eprintln!("error: {message}"),
    }
}

/// `serve`: everything is built and checked before anything listens.
async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let app = App::build(&args).await?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let metrics = match args.metrics_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding --metrics-listen {addr}"))?,
        ),
        None => None,
    };
    let admin = match args.admin_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding --admin-listen {addr}"))?,
        ),
        None => None,
    };
    app.run_with_admin(listener, metrics, admin, shutdown_signal())
        .await
}

/// Completes on SIGTERM (what Kubernetes sends) or Ctrl-C.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
