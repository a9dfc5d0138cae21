//! `demo`: the simulator, the provider and the mock autoscaler in one process.

/// `demo` flags.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {}

/// Runs the demo.
pub async fn run(_args: DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!("the demo is not built yet")
}
