//! Log capture for tests that assert on log lines: every line, at the level the filter lets
//! through, of every crate.

use std::io::Write;
use std::sync::{Arc, Mutex};

/// Where the captured lines go; a [`tracing_subscriber::fmt::MakeWriter`].
#[derive(Clone, Debug, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// Installs a global subscriber with `filter` (an `EnvFilter` directive such as `"trace"`)
    /// writing into a new capture, and returns it. Once per test process.
    pub fn install(filter: &str) -> Captured {
        let captured = Captured::default();
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(captured.clone())
            .with_ansi(false)
            .init();
        captured
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}
