//! `cks-demo`: the simulator, the provider and the mock autoscaler in one process
//! ([`cks_lab::demo`]), printing the scenarios' timeline.

use clap::Parser;
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let args = cks_lab::demo::DemoArgs::parse();
    // The demo prints its own timeline; the provider's logs below warnings would drown it.
    cks_autoscaler_provider::app::init_tracing(
        cks_autoscaler_provider::cli::LogFormat::Text,
        "warn",
    );
    match cks_lab::demo::run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cks-demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}
