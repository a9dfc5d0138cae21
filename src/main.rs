//! The `cks-autoscaler-provider` binary: parses the arguments, binds the listeners the flags
//! name and turns SIGTERM/Ctrl-C into the shutdown the service waits for.

use anyhow::Context;
use cks_autoscaler_provider::app::{App, init_tracing};
use cks_autoscaler_provider::cli::{Command, ServeArgs, parse_args};
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = match parse_args(std::env::args_os().collect()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // The demo prints its own timeline; logs below warnings would drown it.
    let default_filter = match cli.command {
        Command::Demo(_) => "warn",
        _ => "info",
    };
    init_tracing(cli.log_format, default_filter);
    let result = match cli.command {
        Command::Serve(args) => serve(*args).await,
        Command::Demo(args) => cks_autoscaler_provider::demo::run(args).await,
        Command::Probe(args) => cks_autoscaler_provider::probe::run(args).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
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
    app.run(listener, metrics, shutdown_signal()).await
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
