//! Refusals of the replay's input files that say where: `FILE:LINE:COLUMN: what is wrong`,
//! lines and columns counted from 1 (a CSV column is the field's number, a TOML column
//! the character's), so a malformed trace, fleet or price list is refused before
//! anything runs with a place an editor can jump to.

use std::fmt;
use std::path::{Path, PathBuf};

/// One refusal of one input file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file.display(),
            self.line,
            self.column,
            self.message
        )
    }
}

impl std::error::Error for Refusal {}

impl Refusal {
    pub fn at(file: &Path, line: usize, column: usize, message: impl Into<String>) -> Self {
        Self {
            file: file.to_path_buf(),
            line,
            column,
            message: message.into(),
        }
    }

    /// At byte `offset` of `text` (a TOML span's start).
    pub fn at_offset(file: &Path, text: &str, offset: usize, message: impl Into<String>) -> Self {
        let (line, column) = line_and_column(text, offset);
        Self::at(file, line, column, message)
    }
}

/// The 1-based line and character column of byte `offset` in `text`.
pub fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..floor_char_boundary(text, offset.min(text.len()))];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

fn floor_char_boundary(text: &str, mut i: usize) -> usize {
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Reads an input file whole, bounded: a file past `max_bytes` is refused, not loaded.
pub fn read_bounded(file: &Path, max_bytes: u64) -> Result<String, Refusal> {
    let size = std::fs::metadata(file)
        .map_err(|e| Refusal::at(file, 1, 1, format!("cannot read: {e}")))?
        .len();
    if size > max_bytes {
        return Err(Refusal::at(
            file,
            1,
            1,
            format!("{size} bytes, more than the {max_bytes} a replay reads"),
        ));
    }
    std::fs::read_to_string(file).map_err(|e| Refusal::at(file, 1, 1, format!("cannot read: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_become_lines_and_columns() {
        let text = "a = 1\nbé = 2\n";
        assert_eq!(line_and_column(text, 0), (1, 1));
        assert_eq!(line_and_column(text, 6), (2, 1));
        // After the two-byte é: the third character of line 2.
        assert_eq!(line_and_column(text, 9), (2, 3));
        let r = Refusal::at_offset(Path::new("f.toml"), text, 6, "bad");
        assert_eq!(r.to_string(), "f.toml:2:1: bad");
    }
}
