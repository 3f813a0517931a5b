//! The runnable steps of a guide (`docs/guides/fleet-across-hosts.md`,
//! `docs/guides/getting-started.md`): each shell block preceded by a `<!-- recipe: ... -->`
//! line, with where and how the test runs it. The guide is the one source: the test runs
//! exactly these commands. A block without a marker is not run (the test says why).
//!
//! - `values`: `export NAME=...` lines the reader sets to their own values; the test gives
//!   its own (and must give every one).
//! - `on=HOST[,HOST...]`: run on each host named, once, and it must succeed; with
//!   `expect="A:B C"` its output must also hold, for each space-separated group, one line
//!   with every `:`-separated word; with `retry`, again until so (what it waits for comes
//!   up by itself).
//! - `copy` (with `on=HOST`): `scp -p SRC... root@DEST:DIR/` lines, files copied from HOST
//!   to DEST with their modes.
//! - `background` (with `on=HOST`): a command the reader leaves running in a shell of its
//!   own (`serve` in the foreground); the test starts it detached and stops it at the end.
//! - `file=PATH` (with `on=HOST`): the block (of any language: the guide's `terraform`
//!   configuration) is a file the reader writes at PATH, relative to where they are.

/// One block of the guide.
#[derive(Debug, Clone)]
pub struct Step {
    /// The guide's line of the block's opening fence (for messages).
    pub line: usize,
    pub hosts: Vec<String>,
    pub kind: Kind,
    /// Run again until it succeeds (and its output holds what it expects).
    pub retry: bool,
    pub script: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    Values,
    Run,
    /// Groups of words, each group found together on one line.
    Expect(Vec<Vec<String>>),
    Copy,
    Background,
    /// The block's text is this file's content.
    File(String),
}

/// A copy of one `scp -p` line.
#[derive(Debug, Clone, PartialEq)]
pub struct Copy {
    pub sources: Vec<String>,
    pub host: String,
    pub dir: String,
}

/// The steps of `markdown`, in order; panics naming the line of a marker that is not
/// followed by a shell block, or that says nothing it knows.
pub fn parse(markdown: &str) -> Vec<Step> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut steps = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(attrs) = lines[i]
            .trim()
            .strip_prefix("<!-- recipe:")
            .and_then(|r| r.strip_suffix("-->"))
        else {
            i += 1;
            continue;
        };
        let marker = i + 1;
        // A file may be in any language; what runs is shell.
        let any_fence = attrs.contains("file=");
        let fence = (i + 1..lines.len())
            .find(|&j| !lines[j].trim().is_empty())
            .filter(|&j| {
                let fence = lines[j].trim();
                fence == "```sh" || any_fence && fence.starts_with("```") && fence.len() > 3
            })
            .unwrap_or_else(|| {
                panic!("guide line {marker}: a recipe marker not followed by a ```sh block")
            });
        let end = (fence + 1..lines.len())
            .find(|&j| lines[j].trim() == "```")
            .unwrap_or_else(|| panic!("guide line {}: an unclosed block", fence + 1));
        let script = lines[fence + 1..end].join("\n") + "\n";
        steps.push(step(attrs, marker, fence + 1, script));
        i = end + 1;
    }
    steps
}

fn step(attrs: &str, marker: usize, line: usize, script: String) -> Step {
    let mut hosts = Vec::new();
    let (mut kind, mut copy, mut retry) = (Kind::Run, false, false);
    let mut rest = attrs.trim();
    while !rest.is_empty() {
        let (word, after) = if let Some(r) = rest.strip_prefix("expect=\"") {
            let close = r
                .find('"')
                .unwrap_or_else(|| panic!("guide line {marker}: expect=\" not closed"));
            kind = Kind::Expect(
                r[..close]
                    .split_whitespace()
                    .map(|g| g.split(':').map(str::to_string).collect())
                    .collect(),
            );
            ("", &r[close + 1..])
        } else {
            rest.split_once(' ').unwrap_or((rest, ""))
        };
        match word {
            "" => {}
            "values" => kind = Kind::Values,
            "retry" => retry = true,
            "background" => kind = Kind::Background,
            "copy" => copy = true,
            w if w.starts_with("file=") => kind = Kind::File(w[5..].to_string()),
            w if w.starts_with("on=") => hosts = w[3..].split(',').map(str::to_string).collect(),
            w => panic!("guide line {marker}: unknown recipe word {w:?}"),
        }
        rest = after.trim();
    }
    if copy {
        kind = Kind::Copy;
    }
    assert!(
        kind == Kind::Values || !hosts.is_empty(),
        "guide line {marker}: a step names no host (on=HOST)"
    );
    Step {
        line,
        hosts,
        kind,
        retry,
        script,
    }
}

/// Whether `out`, the output of a run of `step` that succeeded or not (`ok`), is what the
/// step wants.
pub fn done(step: &Step, ok: bool, out: &str) -> bool {
    ok && match &step.kind {
        Kind::Expect(groups) => holds(out, groups),
        _ => true,
    }
}

/// The variables a `values` block exports.
pub fn exported(script: &str) -> Vec<String> {
    script
        .lines()
        .filter_map(|l| l.trim().strip_prefix("export "))
        .filter_map(|l| l.split_once('=').map(|(name, _)| name.trim().to_string()))
        .collect()
}

/// The copies of a `copy` block's `scp -p SRC... root@HOST:DIR/` lines.
pub fn copies(script: &str) -> Vec<Copy> {
    script
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            assert!(
                words.len() >= 4 && words[..2] == ["scp", "-p"],
                "not an `scp -p SRC... root@HOST:DIR/` line: {l}"
            );
            let (dest, sources) = words[2..].split_last().unwrap();
            let (host, dir) = dest
                .strip_prefix("root@")
                .and_then(|d| d.split_once(':'))
                .unwrap_or_else(|| panic!("not a root@HOST:DIR destination: {dest}"));
            Copy {
                sources: sources.iter().map(|s| s.to_string()).collect(),
                host: host.to_string(),
                dir: dir.to_string(),
            }
        })
        .collect()
}

/// Whether `output` holds each group of words together on one line.
pub fn holds(output: &str, groups: &[Vec<String>]) -> bool {
    groups.iter().all(|group| {
        output
            .lines()
            .any(|line| group.iter().all(|w| line.contains(w.as_str())))
    })
}

/// How much an operator types: the commands (lines outside heredocs, comments and
/// continuations) and the flags among their words.
pub fn size(steps: &[Step]) -> (usize, usize) {
    let (mut commands, mut flags) = (0, 0);
    let typed = |s: &&Step| !matches!(s.kind, Kind::Values | Kind::File(_));
    for step in steps.iter().filter(typed) {
        let mut heredoc: Option<String> = None;
        let mut continued = false;
        for line in step.script.lines().map(str::trim) {
            if let Some(end) = &heredoc {
                if line == end {
                    heredoc = None;
                }
                continue;
            }
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if !continued {
                commands += 1;
            }
            continued = line.ends_with('\\');
            flags += line
                .split_whitespace()
                .filter(|w| w.starts_with('-') && w.len() > 1)
                .count();
            if let Some(at) = line.find("<<") {
                let tag = line[at + 2..]
                    .trim()
                    .trim_matches(|c| c == '\'' || c == '"');
                heredoc = Some(tag.to_string());
            }
        }
    }
    (commands, flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GUIDE: &str = "text\n<!-- recipe: values -->\n```sh\nexport CP_ADDR=10.0.0.5  # x\n```\n\
        <!-- recipe: on=cp -->\n\n```sh\ncat > f <<'EOF'\n--not-a-flag\nEOF\ngpufleet-agent pki --dir d \\\n  --agent a\n```\n\
        <!-- recipe: on=a,b retry expect=\"gpu-a:ready gpu-b\" -->\n```sh\nnodes\n```\n\
        <!-- recipe: on=cp copy -->\n```sh\nscp -p /x /y root@a:/etc/g/\n```\n\
        <!-- recipe: on=cp background -->\n```sh\nserve --x\n```\n\
        <!-- recipe: on=cp file=d/main.tf -->\n```terraform\nresource \"a\" \"b\" {}\n```\n";

    #[test]
    fn reads_the_steps_their_hosts_and_kinds() {
        let steps = parse(GUIDE);
        assert_eq!(steps.len(), 6);
        assert_eq!(steps[0].kind, Kind::Values);
        assert_eq!(exported(&steps[0].script), ["CP_ADDR"]);
        assert_eq!(steps[1].hosts, ["cp"]);
        assert_eq!(steps[2].hosts, ["a", "b"]);
        assert!(steps[2].retry && !steps[1].retry);
        assert_eq!(
            steps[2].kind,
            Kind::Expect(vec![
                vec!["gpu-a".to_string(), "ready".to_string()],
                vec!["gpu-b".to_string()]
            ])
        );
        assert_eq!(
            copies(&steps[3].script),
            [Copy {
                sources: vec!["/x".into(), "/y".into()],
                host: "a".into(),
                dir: "/etc/g/".into()
            }]
        );
        assert_eq!(steps[4].kind, Kind::Background);
        assert_eq!(steps[5].kind, Kind::File("d/main.tf".into()));
        assert_eq!(steps[5].script, "resource \"a\" \"b\" {}\n");
        // cat (heredoc skipped), the continued pki line, nodes, scp, serve (a file is not
        // typed); flags --dir, --agent, -p, --x.
        assert_eq!(size(&steps), (5, 4));
        assert!(holds(
            "gpu-a  ready\ngpu-b busy\n",
            &[vec!["gpu-a".into(), "ready".into()]]
        ));
        assert!(!holds(
            "gpu-a busy\n",
            &[vec!["gpu-a".into(), "ready".into()]]
        ));
    }
}
