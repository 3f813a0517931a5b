//! Statements are written once, with SQLite's placeholders; PostgreSQL numbers its own
//! with `$`. `?N` becomes `$N` and a bare `?` the next number, outside string literals,
//! quoted identifiers and comments.

/// `sql` with PostgreSQL's placeholders.
pub fn to_postgres(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut next = 0usize;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                out.push(c);
                // Up to the closing quote; a doubled quote is an escaped one and
                // reopens, which this loop reads as close-then-open.
                for q in chars.by_ref() {
                    out.push(q);
                    if q == c {
                        break;
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                out.push(c);
                for q in chars.by_ref() {
                    out.push(q);
                    if q == '\n' {
                        break;
                    }
                }
            }
            '?' => {
                let mut digits = String::new();
                while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    digits.push(*d);
                    chars.next();
                }
                if digits.is_empty() {
                    next += 1;
                    out.push_str(&format!("${next}"));
                } else {
                    out.push('$');
                    out.push_str(&digits);
                }
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::to_postgres;

    #[test]
    fn numbered_and_bare_placeholders_are_numbered_with_dollars() {
        assert_eq!(
            to_postgres("UPDATE t SET a = ?2 WHERE b = ?1 AND c = ?12"),
            "UPDATE t SET a = $2 WHERE b = $1 AND c = $12"
        );
        assert_eq!(
            to_postgres("INSERT INTO t VALUES (?, ?, ?)"),
            "INSERT INTO t VALUES ($1, $2, $3)"
        );
    }

    #[test]
    fn question_marks_in_literals_identifiers_and_comments_stay() {
        assert_eq!(
            to_postgres("SELECT 'a?1', \"b?\", 'it''s ?' FROM t WHERE x = ?1 -- why?\nAND y = ?2"),
            "SELECT 'a?1', \"b?\", 'it''s ?' FROM t WHERE x = $1 -- why?\nAND y = $2"
        );
    }
}
