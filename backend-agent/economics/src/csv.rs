//! The little CSV the replay reads: comma-separated fields, optionally in double quotes
//! (a quote inside written twice), one record per line. Enough for the simple trace, the
//! price list and Alibaba's pod list as published; not a general CSV reader (no newlines
//! inside fields).

/// The fields of one line, or the 1-based column of a malformed quoted field.
pub fn fields(line: &str) -> Result<Vec<String>, usize> {
    let mut out = Vec::new();
    let mut chars = line.trim_end_matches('\r').chars().peekable();
    loop {
        let column = out.len() + 1;
        let mut field = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    Some('"') => break,
                    Some(c) => field.push(c),
                    None => return Err(column),
                }
            }
            match chars.next() {
                None => {
                    out.push(field);
                    return Ok(out);
                }
                Some(',') => out.push(field),
                Some(_) => return Err(column),
            }
        } else {
            loop {
                match chars.next() {
                    None => {
                        out.push(field.trim().to_string());
                        return Ok(out);
                    }
                    Some(',') => break,
                    Some(c) => field.push(c),
                }
            }
            out.push(field.trim().to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_quoted_fields() {
        assert_eq!(fields("a, b ,c").unwrap(), ["a", "b", "c"]);
        assert_eq!(fields("a,,").unwrap(), ["a", "", ""]);
        assert_eq!(
            fields("\"x,y\",\"say \"\"hi\"\"\"\r").unwrap(),
            ["x,y", "say \"hi\""]
        );
        assert_eq!(fields("a,\"open"), Err(2));
        assert_eq!(fields("\"a\"b"), Err(1));
    }
}
