//! The control plane's clock: the system's, or, for tests only, a file holding Unix
//! seconds (`serve --clock-file PATH`) read on every call, so a test moves time (a
//! reservation's window starting) by writing the file instead of sleeping. A missing or
//! unreadable file means the system's time.

use std::path::PathBuf;

/// Where the control plane reads the time. One value per control plane (in its
/// `AppState`), so two in one process (tests, benches) keep their own.
#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// The system's.
    #[default]
    System,
    /// Unix seconds read from this file on every call (the system's when it is missing
    /// or unreadable).
    File(PathBuf),
}

impl Clock {
    /// Seconds since the Unix epoch.
    pub fn now(&self) -> i64 {
        match self {
            Clock::System => system_now(),
            Clock::File(path) => std::fs::read_to_string(path)
                .ok()
                .and_then(|text| text.trim().parse::<i64>().ok())
                .unwrap_or_else(system_now),
        }
    }
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
