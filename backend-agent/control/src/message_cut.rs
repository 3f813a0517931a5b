//! How long an error message may be when it leaves the API, and how it is cut: on a
//! character boundary, saying how long it was.

/// Bytes of a message (UTF-8, before percent-encoding) that reach the client.
pub const MAX_MESSAGE_BYTES: usize = 2048;

/// The longest a message leaves as (a cut one with its note).
pub const MAX_CUT_MESSAGE_BYTES: usize = MAX_MESSAGE_BYTES + 64;

/// `text` cut to `max` bytes on a character boundary, with a note of its full length;
/// as it is when it is short enough.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    cut_noting(text, max, text.len())
}

/// `text` (of `total` bytes before it was decoded) cut to `max` bytes, saying so.
pub fn cut_noting(text: &str, max: usize, total: usize) -> String {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… (message cut: {total} bytes in all)", &text[..end])
}
