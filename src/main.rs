//! The `cks-autoscaler-provider` binary: argument parsing and the runtime only.

use cks_autoscaler_provider::cli::{Command, init_tracing, parse_args, run_serve};

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
        Command::Serve(args) => run_serve(*args).await,
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
