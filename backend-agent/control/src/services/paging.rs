//! Answers that stay readable: list calls answer in pages (at most `page_size` items and
//! never more bytes than fit one gRPC message), and a cluster's answer lists a bounded
//! number of its nodes.
//!
//! A page token is the sort key of the last item answered, so a page resumes after it
//! even when items were added or removed in between (none is answered twice).

use gpufleet_proto::limits::{MAX_CLUSTER_NODES_SHOWN, MAX_MESSAGE_BYTES};
use tonic::Status;

use crate::limits::{encode_token, Page};

/// What one page's items may take: the rest of the 4 MiB is room for the envelope.
const PAGE_BYTES: usize = MAX_MESSAGE_BYTES * 3 / 4;

/// Parses a list request's paging fields.
pub fn parse(page_size: i32, page_token: &str) -> Result<Page, Status> {
    Page::parse(page_size, page_token).map_err(|b| crate::error::Error::from(b).into())
}

/// The page of `rows` after `page.after` in the order of `key`, each row built into its
/// message by `build`, and the next page's token ("" when nothing is left).
pub fn page<R, M: prost::Message>(
    rows: Vec<R>,
    page: &Page,
    key: impl Fn(&R) -> String,
    build: impl FnMut(R) -> Result<M, Status>,
) -> Result<(Vec<M>, String), Status> {
    page_batch(rows, page, key, |rows| {
        rows.into_iter().map(build).collect()
    })
}

/// [`page`] for messages that are built together (one read for the whole page): the
/// page's rows go to `build` at once, in key order, and the byte bound then keeps as many
/// of its messages as fit (at least one).
pub fn page_batch<R, M: prost::Message>(
    rows: Vec<R>,
    page: &Page,
    key: impl Fn(&R) -> String,
    build: impl FnOnce(Vec<R>) -> Result<Vec<M>, Status>,
) -> Result<(Vec<M>, String), Status> {
    let mut keyed: Vec<(String, R)> = rows.into_iter().map(|r| (key(&r), r)).collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    let start = match &page.after {
        Some(after) => keyed.partition_point(|(k, _)| k <= after),
        None => 0,
    };
    let more = keyed.len() > start + page.size;
    let (keys, chosen): (Vec<String>, Vec<R>) =
        keyed.into_iter().skip(start).take(page.size).unzip();
    let mut out = build(chosen)?;
    let mut bytes = 0usize;
    for (i, message) in out.iter().enumerate() {
        // The field tag and length prefix of a repeated message take at most 6 bytes.
        bytes += message.encoded_len() + 6;
        if i > 0 && bytes > PAGE_BYTES {
            out.truncate(i);
            return Ok((out, encode_token(&keys[i - 1])));
        }
    }
    let next = match keys.last() {
        Some(last) if more => encode_token(last),
        _ => String::new(),
    };
    Ok((out, next))
}

/// A sort key for an integer that orders like the integer.
pub fn int_key(value: i64) -> String {
    format!("{:020}", (value as i128) - (i64::MIN as i128))
}

/// The integer an [`int_key`] was made from (None for any other text).
pub fn int_of_key(key: &str) -> Option<i64> {
    let shifted: i128 = key.parse().ok()?;
    i64::try_from(shifted + (i64::MIN as i128)).ok()
}

/// Keeps the first [`MAX_CLUSTER_NODES_SHOWN`] of a cluster's nodes for its answer and
/// says how many were left out (they are read with ListNodes by cluster).
pub fn shown_nodes<T>(nodes: &mut Vec<T>) -> i32 {
    let omitted = nodes.len().saturating_sub(MAX_CLUSTER_NODES_SHOWN);
    nodes.truncate(MAX_CLUSTER_NODES_SHOWN);
    i32::try_from(omitted).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_proto::v1;

    fn tenant(name: &str, display: usize) -> v1::Tenant {
        v1::Tenant {
            id: name.into(),
            name: name.into(),
            display_name: "d".repeat(display),
            ..Default::default()
        }
    }

    /// Follows every page of `names`, returning each page's names.
    fn all_pages(names: &[String], size: usize, display: usize) -> Vec<Vec<String>> {
        let mut pages = Vec::new();
        let mut token = String::new();
        loop {
            let p = parse(size as i32, &token).unwrap();
            let (items, next) = page(
                names.to_vec(),
                &p,
                |n| n.clone(),
                |n| Ok(tenant(&n, display)),
            )
            .unwrap();
            pages.push(items.into_iter().map(|t| t.name).collect());
            if next.is_empty() {
                return pages;
            }
            token = next;
        }
    }

    #[test]
    fn every_item_once_in_key_order() {
        let names: Vec<String> = (0..25).rev().map(|i| format!("t{i:03}")).collect();
        let pages = all_pages(&names, 10, 0);
        assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [10, 10, 5]);
        let flat: Vec<String> = pages.concat();
        let mut expected = names.clone();
        expected.sort();
        assert_eq!(flat, expected);
    }

    #[test]
    fn a_page_never_exceeds_the_message_limit() {
        // 40 items of 256 KiB: 10 MiB in all, so pages end by size before page_size.
        let names: Vec<String> = (0..40).map(|i| format!("t{i:03}")).collect();
        let pages = all_pages(&names, 1000, 256 * 1024);
        assert!(pages.len() >= 4, "{}", pages.len());
        for p in &pages {
            let bytes: usize = p
                .iter()
                .map(|n| prost::Message::encoded_len(&tenant(n, 256 * 1024)) + 6)
                .sum();
            assert!(bytes <= PAGE_BYTES, "{bytes}");
        }
        assert_eq!(pages.concat(), names);
    }

    #[test]
    fn the_last_page_has_no_token_and_empty_lists_answer_empty() {
        let p = parse(0, "").unwrap();
        let (items, next) = page(
            Vec::<String>::new(),
            &p,
            |n| n.clone(),
            |n| Ok(tenant(&n, 0)),
        )
        .unwrap();
        assert!(items.is_empty() && next.is_empty());
        let (_, next) = page(
            vec!["a".to_string()],
            &p,
            |n| n.clone(),
            |n| Ok(tenant(&n, 0)),
        )
        .unwrap();
        assert!(next.is_empty());
    }

    #[test]
    fn integer_keys_order_like_integers() {
        let mut keys = [5, -3, i64::MIN, i64::MAX, 0].map(int_key);
        keys.sort();
        assert_eq!(keys, [i64::MIN, -3, 0, 5, i64::MAX].map(int_key));
    }

    #[test]
    fn cluster_answers_show_a_bounded_number_of_nodes() {
        let mut nodes: Vec<u32> = (0..1100).collect();
        assert_eq!(shown_nodes(&mut nodes), 1000);
        assert_eq!(nodes.len(), MAX_CLUSTER_NODES_SHOWN);
        let mut few = vec![1, 2];
        assert_eq!(shown_nodes(&mut few), 0);
        assert_eq!(few, [1, 2]);
    }
}
