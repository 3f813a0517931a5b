//! Free text that reaches the audit log (and any terminal that shows it) made inert: a
//! caller chooses the object it names and much of a refusal's message, so a newline there
//! could forge a whole line of `gpufleet-agent audit`, and an escape sequence could
//! rewrite the terminal. Control characters, and the format characters that reorder or
//! hide text (bidirectional overrides, zero-width marks), are written as `\u{..}`; the
//! result is bounded in characters.
//!
//! Escaping is idempotent (it leaves backslashes alone), so text escaped when recorded is
//! shown unchanged when the CLI escapes it again.

/// Whether `c` could break a line or change what a terminal shows around it.
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{200B}'..='\u{200F}' // zero-width marks, left-to-right and right-to-left marks
            | '\u{2028}' | '\u{2029}' // line and paragraph separators
            | '\u{202A}'..='\u{202E}' // bidirectional embeddings and overrides
            | '\u{2060}'..='\u{2069}' // word joiner, invisible operators, bidi isolates
            | '\u{FEFF}' // zero-width no-break space
        )
}

/// `text` with every unsafe character written as `\u{..}`, cut to `max_chars` characters
/// (an escape counts as its written length and is never cut in half), ending in "…" when
/// cut.
pub fn escaped(text: &str, max_chars: usize) -> String {
    let mut out = String::new();
    let mut used = 0;
    // Bytes of `out` that still leave room for the "…".
    let mut keep = 0;
    for c in text.chars() {
        let piece: String = if unsafe_char(c) {
            c.escape_unicode().collect()
        } else {
            c.to_string()
        };
        let len = piece.chars().count();
        if used + len > max_chars {
            out.truncate(keep);
            out.push('…');
            return out;
        }
        out.push_str(&piece);
        used += len;
        if used < max_chars {
            keep = out.len();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newline_or_escape_cannot_start_a_line_or_drive_the_terminal() {
        let forged = "x\n42  2026-01-01T00:00:00Z  alpha  admin  DeleteTenant  alpha  OK";
        let e = escaped(forged, 256);
        assert!(!e.contains('\n'), "{e}");
        assert!(e.starts_with("x\\u{a}42"), "{e}");
        let e = escaped("a\u{1b}[2J\r\u{7}\u{202e}b", 256);
        assert_eq!(e, "a\\u{1b}[2J\\u{d}\\u{7}\\u{202e}b");
        assert!(e.chars().all(|c| !c.is_control()));
    }

    #[test]
    fn plain_text_is_kept_and_escaping_twice_changes_nothing() {
        assert_eq!(escaped("team-a/asr ünï 東京", 256), "team-a/asr ünï 東京");
        let once = escaped("a\nb\\c", 256);
        assert_eq!(escaped(&once, 256), once);
    }

    #[test]
    fn long_text_is_cut_never_inside_an_escape() {
        assert_eq!(escaped(&"x".repeat(10), 10), "x".repeat(10));
        assert_eq!(escaped(&"x".repeat(11), 10), format!("{}…", "x".repeat(9)));
        let e = escaped(&"\n".repeat(100), 20);
        assert!(e.chars().count() <= 20, "{e}");
        assert_eq!(e, format!("{}…", "\\u{a}".repeat(3)));
    }
}
