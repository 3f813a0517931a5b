//! The control plane's clock: the system's, or, for tests only, a file holding Unix
//! seconds (`serve --clock-file PATH`) read on every call, so a test moves time (a
//! reservation's window starting) by writing the file instead of sleeping. A missing or
//! unreadable file means the system's time.

use std::path::PathBuf;
use std::sync::OnceLock;

static CLOCK_FILE: OnceLock<PathBuf> = OnceLock::new();

/// From now on, `now()` reads `path` (set once, at startup).
pub fn use_file(path: PathBuf) {
    let _ = CLOCK_FILE.set(path);
}

/// Seconds since the Unix epoch.
pub fn now() -> i64 {
    CLOCK_FILE
        .get()
        .and_then(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| text.trim().parse::<i64>().ok())
        .unwrap_or_else(system_now)
}

fn system_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// RFC 3339 text for messages.
pub fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| unix.to_string())
}
