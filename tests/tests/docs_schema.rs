//! The registry pages in `docs/` against the provider's real schema (`terraform providers
//! schema -json` with the built provider): every resource and data source has its page,
//! every attribute is documented, and no page documents an attribute that does not exist.
//! Ephemeral resources' pages are in `docs/ephemeral-resources/`, list resources' (their
//! `config` block) in `docs/list-resources/`, actions' in `docs/actions/`; the provider's
//! own settings are in `docs/index.md`.

use std::collections::BTreeSet;

use gpufleet_e2e::binaries::workspace_root;
use gpufleet_e2e::Terraform;
use serde_json::Value;

/// The attribute names a page lists in its top-level schema sections (`### Required`,
/// `### Optional`, `### Read-Only`, before any nested schema), as `` - `name` (Type) ``.
fn documented(page: &str) -> BTreeSet<String> {
    let Some(schema) = page.split("## Schema").nth(1) else {
        return BTreeSet::new();
    };
    let top = schema.split("<a id=").next().unwrap_or_default();
    let top = top.split("### Nested Schema").next().unwrap_or_default();
    top.lines()
        .filter_map(|l| l.strip_prefix("- `"))
        .filter_map(|l| l.split_once("` ("))
        .map(|(name, _)| name.to_string())
        .collect()
}

/// The attribute names under `### Nested Schema for `path``.
fn documented_nested(page: &str, path: &str) -> Option<BTreeSet<String>> {
    let header = format!("### Nested Schema for `{path}`");
    let section = page.split(&header).nth(1)?;
    let section = section.split("<a id=").next().unwrap_or_default();
    let section = section
        .split("### Nested Schema")
        .next()
        .unwrap_or_default();
    Some(
        section
            .lines()
            .filter_map(|l| l.strip_prefix("- `"))
            .filter_map(|l| l.split_once("` ("))
            .map(|(name, _)| name.to_string())
            .collect(),
    )
}

/// The object attributes of a Terraform type, through lists, sets and maps: e.g.
/// `["list", ["object", {...}]]`.
fn object_fields(ty: &Value) -> Option<&serde_json::Map<String, Value>> {
    match ty.as_array()?.as_slice() {
        [kind, fields] if kind == "object" => fields.as_object(),
        [kind, inner] if kind == "list" || kind == "set" || kind == "map" => object_fields(inner),
        _ => None,
    }
}

/// Every object-typed attribute's fields against its nested section, recursively
/// (`nodes`, `nodes.gpus`, ...).
fn check_nested(
    page: &str,
    page_name: &str,
    path: &str,
    fields: &serde_json::Map<String, Value>,
    problems: &mut Vec<String>,
) {
    let Some(written) = documented_nested(page, path) else {
        problems.push(format!(
            "{page_name}: no nested schema section for `{path}`"
        ));
        return;
    };
    let real: BTreeSet<String> = fields.keys().cloned().collect();
    for missing in real.difference(&written) {
        problems.push(format!("{page_name}: `{path}.{missing}` is not documented"));
    }
    for extra in written.difference(&real) {
        problems.push(format!(
            "{page_name}: documents `{path}.{extra}`, which the schema lacks"
        ));
    }
    for (name, ty) in fields {
        if let Some(inner) = object_fields(ty) {
            check_nested(page, page_name, &format!("{path}.{name}"), inner, problems);
        }
    }
}

/// The section each top-level attribute is listed in ("Required", "Optional", "Read-Only").
fn sections(page: &str) -> Vec<(String, String)> {
    let Some(schema) = page.split("## Schema").nth(1) else {
        return Vec::new();
    };
    let top = schema.split("<a id=").next().unwrap_or_default();
    let top = top.split("### Nested Schema").next().unwrap_or_default();
    let mut section = String::new();
    let mut out = Vec::new();
    for line in top.lines() {
        if let Some(h) = line.strip_prefix("### ") {
            section = h.trim().to_string();
        } else if let Some((name, _)) = line.strip_prefix("- `").and_then(|l| l.split_once("` (")) {
            out.push((name.to_string(), section.clone()));
        }
    }
    out
}

/// Where the registry lists an attribute with these schema flags.
fn expected_section(spec: &Value) -> &'static str {
    if spec["required"] == true {
        "Required"
    } else if spec["optional"] == true {
        "Optional"
    } else {
        "Read-Only"
    }
}

fn attributes(block: &Value) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = block["attributes"]
        .as_object()
        .map(|a| a.keys().cloned().collect())
        .unwrap_or_default();
    if let Some(blocks) = block["block_types"].as_object() {
        names.extend(blocks.keys().cloned());
    }
    names
}

#[test]
fn every_resource_and_data_source_page_matches_the_schema() {
    let tf = Terraform::detached("http://127.0.0.1:9", "unused");
    tf.init();
    let run = tf.run_ok(&["providers", "schema", "-json"]);
    let schema: Value = serde_json::from_str(&run.stdout).expect("schema JSON");
    let provider = &schema["provider_schemas"]["registry.terraform.io/gpufleet/gpufleet"];
    let docs = workspace_root().join("docs");
    let mut problems = Vec::new();
    let mut checked = 0;
    for (kind, folder) in [
        ("resource_schemas", "resources"),
        ("data_source_schemas", "data-sources"),
        ("ephemeral_resource_schemas", "ephemeral-resources"),
        ("list_resource_schemas", "list-resources"),
        ("action_schemas", "actions"),
    ] {
        let entries = provider[kind].as_object().expect("schemas");
        assert!(!entries.is_empty(), "no {kind} in the schema");
        for (name, entry) in entries {
            let short = name.strip_prefix("gpufleet_").expect("gpufleet_ prefix");
            let path = docs.join(folder).join(format!("{short}.md"));
            let Ok(page) = std::fs::read_to_string(&path) else {
                problems.push(format!("{name}: no page {}", path.display()));
                continue;
            };
            let real = attributes(&entry["block"]);
            let written = documented(&page);
            for missing in real.difference(&written) {
                problems.push(format!(
                    "{name}: `{missing}` is not documented in {folder}/{short}.md"
                ));
            }
            for extra in written.difference(&real) {
                problems.push(format!(
                    "{name}: {folder}/{short}.md documents `{extra}`, which the schema lacks"
                ));
            }
            if let Some(attrs) = entry["block"]["attributes"].as_object() {
                for (attr, section) in sections(&page) {
                    if let Some(spec) = attrs.get(&attr) {
                        let want = expected_section(spec);
                        if section != want {
                            problems.push(format!(
                                "{name}: `{attr}` is listed under {section}, but it is {want}"
                            ));
                        }
                    }
                }
                for (attr, spec) in attrs {
                    if let Some(fields) = object_fields(&spec["type"]) {
                        check_nested(&page, name, attr, fields, &mut problems);
                    }
                }
            }
            checked += 1;
        }
    }
    let index = std::fs::read_to_string(docs.join("index.md")).expect("docs/index.md");
    let settings = attributes(&provider["provider"]["block"]);
    let written = documented(&index);
    for missing in settings.difference(&written) {
        problems.push(format!(
            "provider: `{missing}` is not documented in index.md"
        ));
    }
    for extra in written.difference(&settings) {
        problems.push(format!(
            "provider: index.md documents `{extra}`, which the schema lacks"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Four resources and seven data sources, four lists and three actions at least; a new
    // one must come with its page.
    assert!(checked >= 18, "only {checked} pages checked");
}

#[test]
fn the_page_reader_finds_top_level_attributes_only() {
    let page = "# x\n## Schema\n\n### Required\n\n- `a` (String) x\n\n### Read-Only\n\n- `b` (Number) y\n\n<a id=\"n\"></a>\n### Nested Schema for `b`\n\n- `c` (String) z\n";
    let got: Vec<String> = documented(page).into_iter().collect();
    assert_eq!(got, vec!["a".to_string(), "b".to_string()]);
}
