//! The log capture a test binary shares: one global `tracing` subscriber (a process has one),
//! installed by the first test that asks, writing every line into one buffer. Tests look for
//! lines naming their own identities (unique names, ports, files), so tests running in
//! parallel do not read each other's lines as theirs.
//!
//! The provider's own lines are kept from `debug` up, other crates' from `info`: enough for
//! what the tests look for without the HTTP/2 stack's chatter filling memory over a whole run.
//! A test that must see everything (every level, every crate) installs a subscriber of its own
//! for its thread instead (`tracing::subscriber::set_default` on a current-thread runtime).

use std::io::Write;
use std::sync::{Mutex, Once};

static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn lock() -> std::sync::MutexGuard<'static, Vec<u8>> {
    LOGS.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Installs the capture, once per process.
pub fn capture() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        tracing_subscriber::fmt()
            .with_writer(|| Capture)
            .with_ansi(false)
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "info,cks_autoscaler_provider=debug,cks_cloudstack=debug",
            ))
            .init();
    });
}

/// The captured lines that contain `needle`.
pub fn lines_mentioning(needle: &str) -> Vec<String> {
    String::from_utf8_lossy(&lock())
        .lines()
        .filter(|line| line.contains(needle))
        .map(str::to_owned)
        .collect()
}

/// A capture of one test thread's lines only, at every level: a subscriber of its own for the
/// thread while it lives. For a synchronous test that must not depend on the process's global
/// subscriber, which other tests of the binary (scoped subscribers of their own among them) may
/// race with when it is installed.
pub struct Scoped {
    lines: std::sync::Arc<Mutex<Vec<u8>>>,
    _guard: tracing::subscriber::DefaultGuard,
}

#[derive(Clone)]
struct ScopedWriter(std::sync::Arc<Mutex<Vec<u8>>>);

impl Write for ScopedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Scoped {
    /// Captures this thread's lines until the value is dropped.
    pub fn start() -> Scoped {
        let lines = std::sync::Arc::new(Mutex::new(Vec::new()));
        let writer = ScopedWriter(lines.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        Scoped {
            lines,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    /// The captured lines that contain `needle`.
    pub fn lines_mentioning(&self, needle: &str) -> Vec<String> {
        let text = self
            .lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        String::from_utf8_lossy(&text)
            .lines()
            .filter(|line| line.contains(needle))
            .map(str::to_owned)
            .collect()
    }
}
