//! One Terraform working directory, wired to the provider under test.
//!
//! The directory holds `providers.tf` (the `gpufleet/gpufleet` requirement), the test's
//! `main.tf` and a CLI config that installs the provider under test as an operator does:
//! `terraform init` from the release's filesystem mirror (`scripts/release.sh`, made once
//! per provider build: [`crate::mirror`]), so no registry is involved. The provider is configured through
//! `GPUFLEET_ENDPOINT` / `GPUFLEET_TOKEN`, and `GPUFLEET_CA_CERT_PEM` for a TLS backend.
//!
//! Methods named after a command assert that it succeeded and return its output; the
//! `*_fails` ones assert that it failed. Every failed assertion prints Terraform's output and
//! the tail of the backend's log.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::backend::Backend;
use crate::binaries;
use crate::netns::{Host, Launcher};

/// The required_providers block every working directory gets.
const PROVIDERS_TF: &str = r#"terraform {
  required_providers {
    gpufleet = {
      source = "gpufleet/gpufleet"
    }
  }
}
"#;

/// How much of the backend's log a failure message shows.
const LOG_TAIL_LINES: usize = 40;

/// The outcome of one Terraform command.
#[derive(Debug, Clone)]
pub struct TfRun {
    pub args: Vec<String>,
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl TfRun {
    /// stdout then stderr: where to look for a message without caring which stream has it.
    pub fn output(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }

    /// Asserts that the output contains every one of `needles`.
    pub fn assert_mentions(&self, needles: &[&str]) {
        let output = self.output();
        let missing: Vec<&&str> = needles.iter().filter(|n| !output.contains(**n)).collect();
        assert!(
            missing.is_empty(),
            "terraform output lacks {missing:?}\n{self}"
        );
    }
}

impl fmt::Display for TfRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "$ terraform {} -> exit {}",
            self.args.join(" "),
            self.code
        )?;
        writeln!(f, "--- stdout ---\n{}", self.stdout)?;
        write!(f, "--- stderr ---\n{}", self.stderr)
    }
}

/// One resource change in a saved plan: its address and Terraform's actions
/// (`["create"]`, `["update"]`, `["delete", "create"]`, `["no-op"]`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedChange {
    pub address: String,
    pub actions: Vec<String>,
    /// The full `resource_changes[]` entry (before, after, after_unknown, replace_paths).
    pub detail: Value,
}

pub struct Terraform {
    dir: tempfile::TempDir,
    terraform: PathBuf,
    cli_config: PathBuf,
    endpoint: String,
    token: String,
    /// GPUFLEET_CA_CERT_PEM; unset when `None`.
    ca_cert_pem: Option<String>,
    backend_log: Option<PathBuf>,
    /// The multi-host tier: the host Terraform (and so the provider) runs on.
    host: Option<Launcher>,
}

impl Terraform {
    /// The multi-host tier: a working directory on `host` (the tenant's client host)
    /// that reaches `backend` only through its address.
    pub fn on_host(host: &Host, backend: &Backend, token: &str) -> Terraform {
        let mut tf = Terraform::new(backend, token);
        // The host has a /tmp of its own: the working directory lives in the host's dir.
        let dir = tempfile::Builder::new()
            .prefix("gpufleet-tf-")
            .tempdir_in(host.dir())
            .expect("create Terraform working dir on the host");
        for name in ["cli.tfrc", "providers.tf"] {
            fs::copy(tf.dir.path().join(name), dir.path().join(name))
                .unwrap_or_else(|e| panic!("copy {name} to the host's working dir: {e}"));
        }
        tf.cli_config = dir.path().join("cli.tfrc");
        tf.dir = dir;
        tf.host = Some(host.launcher());
        tf
    }

    /// A working directory that talks to `backend` with `token` (trusting its CA through
    /// GPUFLEET_CA_CERT_PEM when it serves TLS).
    pub fn new(backend: &Backend, token: &str) -> Terraform {
        let mut tf = Terraform::detached(&backend.endpoint(), token);
        tf.backend_log = Some(backend.log_path());
        tf.ca_cert_pem = backend.ca_cert_pem().map(str::to_string);
        tf
    }

    /// A working directory for any endpoint (e.g. one where nothing listens).
    pub fn detached(endpoint: &str, token: &str) -> Terraform {
        let dir = tempfile::Builder::new()
            .prefix("gpufleet-tf-")
            .tempdir()
            .expect("create Terraform working dir");
        let cli_config = dir.path().join("cli.tfrc");
        fs::write(
            &cli_config,
            crate::mirror::cli_config(crate::mirror::release_mirror()),
        )
        .expect("write CLI config");
        fs::write(dir.path().join("providers.tf"), PROVIDERS_TF).expect("write providers.tf");
        Terraform {
            dir,
            terraform: binaries::terraform(),
            cli_config,
            endpoint: endpoint.to_string(),
            token: token.to_string(),
            ca_cert_pem: None,
            backend_log: None,
            host: None,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Later commands use `token` (GPUFLEET_TOKEN).
    pub fn set_token(&mut self, token: &str) {
        self.token = token.to_string();
    }

    /// Later commands set GPUFLEET_CA_CERT_PEM to `pem`, or leave it unset for `None`
    /// (e.g. to configure `ca_cert_pem` in the provider block instead).
    pub fn set_ca_cert_pem(&mut self, pem: Option<&str>) {
        self.ca_cert_pem = pem.map(str::to_string);
    }

    /// Keeps the deprecated credential attributes (`gpufleet_tenant.token`,
    /// `gpufleet_tenant_token.token`, `gpufleet_tenant_cluster.credentials`) in state, for a
    /// test that reads them: the provider leaves them null unless its block says
    /// `store_credentials_in_state = true` (a file of its own, so `main.tf` may change).
    pub fn keep_credentials_in_state(&self) {
        self.write_file(
            "credentials_in_state.tf",
            "provider \"gpufleet\" {\n  store_credentials_in_state = true\n}\n",
        );
    }

    /// Replaces `main.tf`.
    pub fn write_main(&self, hcl: &str) {
        self.write_file("main.tf", hcl);
    }

    /// Writes (or replaces) a file in the working directory, e.g. `imports.tf`.
    pub fn write_file(&self, name: &str, content: &str) {
        let path = self.dir.path().join(name);
        fs::write(&path, content).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    pub fn remove_file(&self, name: &str) {
        let path = self.dir.path().join(name);
        fs::remove_file(&path).unwrap_or_else(|e| panic!("remove {}: {e}", path.display()));
    }

    /// Runs `terraform <args>` in the working directory and returns what happened.
    pub fn run(&self, args: &[&str]) -> TfRun {
        let mut command = match &self.host {
            Some(host) => host.command_in(self.dir.path(), &self.terraform),
            None => Command::new(&self.terraform),
        };
        match &self.ca_cert_pem {
            Some(pem) => command.env("GPUFLEET_CA_CERT_PEM", pem),
            None => command.env_remove("GPUFLEET_CA_CERT_PEM"),
        };
        let output = command
            .args(args)
            .current_dir(self.dir.path())
            .env("TF_CLI_CONFIG_FILE", &self.cli_config)
            .env("CHECKPOINT_DISABLE", "1")
            .env("TF_IN_AUTOMATION", "1")
            .env("TF_INPUT", "0")
            .env("GPUFLEET_ENDPOINT", &self.endpoint)
            .env("GPUFLEET_TOKEN", &self.token)
            .env_remove("TF_LOG")
            .env_remove("TF_WORKSPACE")
            .output()
            .unwrap_or_else(|e| panic!("run {} {args:?}: {e}", self.terraform.display()));
        TfRun {
            args: args.iter().map(|a| a.to_string()).collect(),
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Runs and asserts exit 0.
    pub fn run_ok(&self, args: &[&str]) -> TfRun {
        let run = self.run(args);
        if run.code != 0 {
            panic!("terraform failed\n{run}{}", self.backend_log_tail());
        }
        run
    }

    /// Runs and asserts a non-zero exit (a Terraform error, not a crash of the harness).
    pub fn run_fails(&self, args: &[&str]) -> TfRun {
        let run = self.run(args);
        if run.code == 0 {
            panic!(
                "terraform succeeded where it must fail\n{run}{}",
                self.backend_log_tail()
            );
        }
        run
    }

    /// Prepares the working directory: `terraform init` installs the provider from the
    /// release's mirror (and the modules), and locks it.
    pub fn init(&self) -> TfRun {
        self.run_ok(&["init", "-input=false", "-no-color"])
    }

    pub fn plan(&self) -> TfRun {
        self.run_ok(&["plan", "-no-color", "-input=false"])
    }

    pub fn plan_fails(&self) -> TfRun {
        self.run_fails(&["plan", "-no-color", "-input=false"])
    }

    pub fn apply(&self) -> TfRun {
        self.run_ok(&["apply", "-auto-approve", "-no-color", "-input=false"])
    }

    pub fn apply_fails(&self) -> TfRun {
        self.run_fails(&["apply", "-auto-approve", "-no-color", "-input=false"])
    }

    /// `plan -out=<file>`: a saved plan to apply later with [`Terraform::apply_saved`].
    pub fn save_plan(&self, file: &str) -> TfRun {
        self.run_ok(&["plan", "-no-color", "-input=false", &format!("-out={file}")])
    }

    /// `apply <file>`: applies a saved plan exactly as it was planned.
    pub fn apply_saved(&self, file: &str) -> TfRun {
        self.run_ok(&["apply", "-no-color", "-input=false", file])
    }

    pub fn apply_saved_fails(&self, file: &str) -> TfRun {
        self.run_fails(&["apply", "-no-color", "-input=false", file])
    }

    /// `apply -refresh-only`: state follows the backend, nothing else changes.
    pub fn refresh(&self) -> TfRun {
        self.run_ok(&[
            "apply",
            "-refresh-only",
            "-auto-approve",
            "-no-color",
            "-input=false",
        ])
    }

    pub fn destroy(&self) -> TfRun {
        self.run_ok(&["destroy", "-auto-approve", "-no-color", "-input=false"])
    }

    pub fn import(&self, address: &str, id: &str) -> TfRun {
        self.run_ok(&["import", "-no-color", "-input=false", address, id])
    }

    /// `plan -detailed-exitcode`: 0 when there is nothing to do, 2 when there are changes.
    /// Panics on an error (exit 1).
    pub fn plan_detailed_exitcode(&self) -> i32 {
        let run = self.run(&["plan", "-detailed-exitcode", "-no-color", "-input=false"]);
        match run.code {
            0 | 2 => run.code,
            _ => panic!("terraform plan failed\n{run}{}", self.backend_log_tail()),
        }
    }

    /// Asserts that a plan has nothing to do, printing the plan when it does.
    pub fn assert_no_changes(&self) {
        let run = self.run(&["plan", "-detailed-exitcode", "-no-color", "-input=false"]);
        match run.code {
            0 => {}
            2 => panic!("expected no changes, the plan has some\n{run}"),
            _ => panic!("terraform plan failed\n{run}{}", self.backend_log_tail()),
        }
    }

    /// Plans into a file and returns the resource changes Terraform reports in JSON, with
    /// the human-readable plan text.
    pub fn plan_changes(&self) -> (Vec<PlannedChange>, TfRun) {
        let text = self.run_ok(&["plan", "-no-color", "-input=false", "-out=tfplan"]);
        let json = self.run_ok(&["show", "-json", "tfplan"]);
        let plan: Value = parse_json(&json);
        let changes = plan["resource_changes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|change| PlannedChange {
                address: change["address"].as_str().unwrap_or_default().to_string(),
                actions: change["change"]["actions"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|s| s.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default(),
                detail: change,
            })
            .collect();
        (changes, text)
    }

    /// The actions planned for `address` (`["no-op"]` when it is unchanged).
    pub fn planned_actions(&self, address: &str) -> Vec<String> {
        let (changes, text) = self.plan_changes();
        changes
            .into_iter()
            .find(|c| c.address == address)
            .map(|c| c.actions)
            .unwrap_or_else(|| panic!("the plan has no entry for {address}\n{text}"))
    }

    pub fn state_show(&self, address: &str) -> String {
        self.run_ok(&["state", "show", "-no-color", address]).stdout
    }

    /// Resource addresses in state (modules included), sorted; empty when there is no state.
    pub fn state_list(&self) -> Vec<String> {
        let run = self.run_ok(&["show", "-json"]);
        let state: Value = parse_json(&run);
        let mut list = Vec::new();
        collect_addresses(&state["values"]["root_module"], &mut list);
        list.sort();
        list
    }

    /// `terraform output -json`: output name -> value (sensitive ones included).
    pub fn outputs(&self) -> Value {
        let run = self.run_ok(&["output", "-json"]);
        let all: Value = parse_json(&run);
        let mut values = serde_json::Map::new();
        if let Some(map) = all.as_object() {
            for (name, output) in map {
                values.insert(name.clone(), output["value"].clone());
            }
        }
        Value::Object(values)
    }

    /// The attribute values of `address` in state (from `terraform show -json`), sensitive
    /// ones included.
    pub fn resource(&self, address: &str) -> Value {
        self.find_resource(address).unwrap_or_else(|| {
            panic!(
                "{address} is not in state; state has {:?}",
                self.state_list()
            )
        })
    }

    /// Like [`Terraform::resource`], `None` when `address` is not in state.
    pub fn find_resource(&self, address: &str) -> Option<Value> {
        let run = self.run_ok(&["show", "-json"]);
        let state: Value = parse_json(&run);
        let root = &state["values"]["root_module"];
        let mut found = find_in_module(root, address);
        if found.is_none() {
            if let Some(children) = root["child_modules"].as_array() {
                found = children.iter().find_map(|m| find_in_module(m, address));
            }
        }
        found
    }

    fn backend_log_tail(&self) -> String {
        let Some(path) = &self.backend_log else {
            return String::new();
        };
        let log = fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
        format!(
            "\n--- backend log (last {LOG_TAIL_LINES} lines) ---\n{}",
            tail.join("\n")
        )
    }
}

fn collect_addresses(module: &Value, into: &mut Vec<String>) {
    if let Some(resources) = module["resources"].as_array() {
        into.extend(
            resources
                .iter()
                .filter_map(|r| r["address"].as_str().map(str::to_string)),
        );
    }
    if let Some(children) = module["child_modules"].as_array() {
        for child in children {
            collect_addresses(child, into);
        }
    }
}

/// Whether a message says an object does not exist, in any of the usual wordings.
pub fn says_not_found(message: &str) -> bool {
    let message = message.to_lowercase();
    ["not found", "does not exist", "no such"]
        .iter()
        .any(|phrase| message.contains(phrase))
        || (message.contains("error: no ") && message.contains(" with id "))
}

fn find_in_module(module: &Value, address: &str) -> Option<Value> {
    module["resources"]
        .as_array()?
        .iter()
        .find(|r| r["address"] == address)
        .map(|r| r["values"].clone())
}

fn parse_json(run: &TfRun) -> Value {
    serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("terraform printed no JSON ({e})\n{run}"))
}

/// `s` as an HCL string literal.
pub fn hcl_string(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialize")
}
