//! The mounts of this thread's mount namespace, as `/proc/thread-self/mountinfo` lists them:
//! where each is, its file system type and its source. The team volumes' code reads
//! which volume mounts exist and whose they are from it.

use std::path::{Path, PathBuf};

/// One mount: its mount point, file system type and source (a device such as
/// `/dev/loop3`, or what the file system names itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub target: PathBuf,
    pub fstype: String,
    pub source: String,
}

/// Every mount strictly under `root` (not `root` itself), in mountinfo's order (a mount
/// stacked over another comes after it).
pub fn under(root: &Path) -> Result<Vec<Mount>, String> {
    let text = std::fs::read_to_string("/proc/thread-self/mountinfo")
        .map_err(|e| format!("reading /proc/thread-self/mountinfo: {e}"))?;
    Ok(parse(&text)
        .into_iter()
        .filter(|m| m.target.starts_with(root) && m.target != root)
        .collect())
}

/// mountinfo's lines: `ID PARENT MAJ:MIN ROOT TARGET OPTIONS [TAGS...] - TYPE SOURCE ...`.
fn parse(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let target = left.split(' ').nth(4)?;
            let mut after = right.split(' ');
            Some(Mount {
                target: PathBuf::from(unescape(target)),
                fstype: after.next()?.to_string(),
                source: unescape(after.next()?),
            })
        })
        .collect()
}

/// mountinfo's octal escapes (`\040` for a space).
pub fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        match u8::from_str_radix(rest.get(i + 1..i + 4).unwrap_or(""), 8) {
            Ok(b) => {
                out.push(b as char);
                rest = &rest[i + 4..];
            }
            Err(_) => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_read_with_their_type_and_source() {
        let text = "36 35 98:0 / /run/gpufleet/volumes/t/a\\040b rw,nosuid shared:1 - ext4 /dev/loop3 rw\n\
                    37 35 0:52 /t/c /run/gpufleet/volumes/t/c rw - btrfs /dev/loop1 rw,space_cache\n\
                    garbage\n";
        assert_eq!(
            parse(text),
            vec![
                Mount {
                    target: "/run/gpufleet/volumes/t/a b".into(),
                    fstype: "ext4".into(),
                    source: "/dev/loop3".into()
                },
                Mount {
                    target: "/run/gpufleet/volumes/t/c".into(),
                    fstype: "btrfs".into(),
                    source: "/dev/loop1".into()
                },
            ]
        );
    }

    #[test]
    fn mountinfo_escapes_are_read_back() {
        assert_eq!(unescape("/run/a\\040b"), "/run/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
