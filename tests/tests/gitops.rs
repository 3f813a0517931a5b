//! `examples/gitops/pipeline.sh` against a real backend: on a copy of the example, it
//! formats, validates, plans and applies the team definitions (each team's tenant, quota and
//! cluster exist in the backend), a second run plans no changes and applies nothing, a badly
//! formatted team file stops it at `fmt` and a typo'd GPU model at `plan` (naming
//! `gpu_type`), both before anything is applied, and `--plan-only` saves a plan without
//! applying it.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpufleet_e2e::binaries::{terraform, workspace_root};
use gpufleet_e2e::grpc::Inventory;
use gpufleet_e2e::Backend;
use gpufleet_proto::v1::{GpuQuota, TenantCluster};

/// What the example's files are copied without: the results of a run in the checkout.
const NOT_COPIED: &[&str] = &[".terraform", "tfplan", ".terraform.lock.hcl"];

/// A copy of `examples/gitops` in a temp dir, with a CLI config that installs the provider
/// under test from its release mirror (`terraform init`, as a pipeline does).
struct Gitops {
    root: tempfile::TempDir,
    cli_config: PathBuf,
    endpoint: String,
    token: String,
}

/// One run of `pipeline.sh`.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn output(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }

    /// The `pipeline: ...` lines, in order.
    fn pipeline_lines(&self) -> Vec<String> {
        self.output()
            .lines()
            .filter(|l| l.starts_with("pipeline: "))
            .map(str::to_string)
            .collect()
    }

    /// Whether the pipeline started step `name`.
    fn ran_step(&self, name: &str) -> bool {
        let prefix = format!("pipeline: step {name}: ");
        self.stdout.lines().any(|l| l.starts_with(&prefix))
    }
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "$ pipeline.sh -> exit {}", self.code)?;
        writeln!(f, "--- stdout ---\n{}", self.stdout)?;
        write!(f, "--- stderr ---\n{}", self.stderr)
    }
}

impl Gitops {
    fn new(backend: &Backend) -> Gitops {
        let root = tempfile::Builder::new()
            .prefix("gpufleet-gitops-")
            .tempdir()
            .expect("create temp dir");
        // The teams call the onboarding example's module by relative path: copy both.
        for dir in ["examples/gitops", "examples/onboarding/modules"] {
            copy_dir(&workspace_root().join(dir), &root.path().join(dir));
        }
        // The provider as a pipeline installs it: `terraform init` from the release's
        // mirror (scripts/release.sh), not dev_overrides.
        let cli_config = root.path().join("cli.tfrc");
        fs::write(
            &cli_config,
            gpufleet_e2e::mirror::cli_config(gpufleet_e2e::mirror::release_mirror()),
        )
        .expect("write CLI config");
        Gitops {
            root,
            cli_config,
            endpoint: backend.endpoint(),
            token: backend.admin_token().to_string(),
        }
    }

    fn teams_dir(&self) -> PathBuf {
        self.root.path().join("examples/gitops/teams")
    }

    fn write_team(&self, file: &str, hcl: &str) {
        let path = self.teams_dir().join(file);
        fs::write(&path, hcl).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    fn run(&self, args: &[&str]) -> Run {
        let terraform = terraform();
        let mut path = std::env::var_os("PATH").unwrap_or_default();
        if let Some(dir) = terraform.parent().filter(|d| !d.as_os_str().is_empty()) {
            let mut dirs = vec![dir.to_path_buf()];
            dirs.extend(std::env::split_paths(&path));
            path = std::env::join_paths(dirs).expect("PATH entries");
        }
        let script = self.root.path().join("examples/gitops/pipeline.sh");
        let output = Command::new("bash")
            .arg(&script)
            .args(args)
            // Run from elsewhere: the script must find its teams/ by itself.
            .current_dir(self.root.path())
            .env("PATH", path)
            .env("TERRAFORM", &terraform)
            .env("TF_CLI_CONFIG_FILE", &self.cli_config)
            .env("CHECKPOINT_DISABLE", "1")
            .env("GPUFLEET_ENDPOINT", &self.endpoint)
            .env("GPUFLEET_TOKEN", &self.token)
            .env_remove("GPUFLEET_CA_CERT_PEM")
            .env_remove("TF_LOG")
            .env_remove("TF_WORKSPACE")
            .env_remove("INIT_MODE")
            .env_remove("PLAN_FILE")
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap_or_else(|e| panic!("create {}: {e}", to.display()));
    for entry in fs::read_dir(from).unwrap_or_else(|e| panic!("read {}: {e}", from.display())) {
        let entry = entry.expect("directory entry");
        let name = entry.file_name();
        let name_str = name.to_string_lossy();
        if NOT_COPIED.contains(&name_str.as_ref()) || name_str.starts_with("terraform.tfstate") {
            continue;
        }
        let target = to.join(&name);
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target)
                .unwrap_or_else(|e| panic!("copy {}: {e}", entry.path().display()));
        }
    }
}

fn quota_of<'a>(inventory: &'a Inventory, tenant_id: &str) -> &'a GpuQuota {
    let quotas: Vec<&GpuQuota> = inventory
        .quotas
        .iter()
        .filter(|q| q.tenant_id == tenant_id)
        .collect();
    assert_eq!(quotas.len(), 1, "one quota per team: {inventory:#?}");
    quotas[0]
}

fn cluster_of<'a>(inventory: &'a Inventory, tenant_id: &str) -> &'a TenantCluster {
    let clusters: Vec<&TenantCluster> = inventory
        .clusters
        .iter()
        .filter(|c| c.tenant_id == tenant_id)
        .collect();
    assert_eq!(clusters.len(), 1, "one cluster per team: {inventory:#?}");
    clusters[0]
}

fn tenant_id(inventory: &Inventory, name: &str) -> String {
    inventory
        .tenants
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tenant {name} in the backend: {inventory:#?}"))
        .id
        .clone()
}

/// A new team, `nlp`, as a file that `terraform fmt` would rewrite (unaligned `=`, no
/// indentation).
const NLP_BADLY_FORMATTED: &str = r#"module "nlp" {
source = "../../onboarding/modules/team"
  name = "nlp"
  gpu_type = "H100-80GB"
  gpus = 8
}
"#;

/// The same team, formatted, with a GPU model the fleet does not have.
const NLP_TYPO: &str = r#"module "nlp" {
  source = "../../onboarding/modules/team"

  name     = "nlp"
  gpu_type = "H100-80G"
  gpus     = 8
}
"#;

#[tokio::test(flavor = "multi_thread")]
async fn pipeline_applies_the_teams_then_plans_nothing_and_stops_at_the_first_failing_step() {
    let backend = Backend::start();
    let gitops = Gitops::new(&backend);
    let mut admin = backend.admin().await;
    assert!(admin.inventory().await.is_empty());

    // First run: every step, and the two teams applied.
    let first = gitops.run(&[]);
    assert_eq!(first.code, 0, "the first run must succeed\n{first}");
    for step in ["fmt", "init", "validate", "plan", "apply"] {
        assert!(first.ran_step(step), "step {step} did not run\n{first}");
    }
    // `terraform init` installed the provider from the release's mirror and locked it.
    assert!(
        first.output().contains("Installed gpufleet/gpufleet v"),
        "{first}"
    );
    assert!(gitops.teams_dir().join(".terraform.lock.hcl").exists());
    assert_eq!(
        first.pipeline_lines().last().map(String::as_str),
        Some("pipeline: applied"),
        "{first}"
    );
    assert!(
        !gitops.teams_dir().join("tfplan").exists(),
        "the applied plan file is removed"
    );

    let applied = admin.inventory().await;
    assert_eq!(applied.tenants.len(), 2, "{applied:#?}");

    let speech = tenant_id(&applied, "speech");
    let quota = quota_of(&applied, &speech);
    assert_eq!(
        (quota.gpu_type.as_str(), quota.gpus, quota.burst_gpus),
        ("A100-80GB", 8, 0)
    );
    let cluster = cluster_of(&applied, &speech);
    assert_eq!(cluster.name, "speech");
    assert_eq!(cluster.orchestrator, "slurm");
    assert_eq!(cluster.gpu_type, "A100-80GB");
    assert_eq!(cluster.node_count, 1);
    assert_eq!(cluster.storage_gib, 200);
    assert_eq!(cluster.status, "running", "{cluster:#?}");
    assert_eq!(cluster.nodes.len(), 1);
    for gpu in &cluster.nodes[0].gpus {
        let mut profiles: Vec<&str> = gpu.mig_devices.iter().map(|d| d.profile.as_str()).collect();
        profiles.sort_unstable();
        assert_eq!(
            profiles,
            ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"],
            "every GPU of speech's node is split as its team file says: {gpu:#?}"
        );
    }

    let vision = tenant_id(&applied, "vision");
    let quota = quota_of(&applied, &vision);
    assert_eq!(
        (quota.gpu_type.as_str(), quota.gpus, quota.burst_gpus),
        ("H100-80GB", 16, 8)
    );
    let cluster = cluster_of(&applied, &vision);
    assert_eq!(cluster.orchestrator, "kubernetes");
    assert_eq!(cluster.gpu_type, "H100-80GB");
    assert_eq!(cluster.node_count, 2);
    assert_eq!(cluster.nodes.len(), 2);
    assert_eq!(cluster.status, "running", "{cluster:#?}");
    assert!(cluster.mig_layout.is_empty());

    // Second run: the plan has nothing to do, and nothing is applied.
    let second = gitops.run(&[]);
    assert_eq!(second.code, 0, "the second run must succeed\n{second}");
    assert_eq!(
        second.pipeline_lines().last().map(String::as_str),
        Some("pipeline: no changes"),
        "{second}"
    );
    assert!(!second.ran_step("apply"), "nothing to apply\n{second}");
    assert_eq!(admin.inventory().await, applied);

    // A badly formatted new team: the pipeline stops at fmt, before contacting anyone.
    gitops.write_team("nlp.tf", NLP_BADLY_FORMATTED);
    let badly_formatted = gitops.run(&[]);
    assert_ne!(badly_formatted.code, 0, "{badly_formatted}");
    assert!(
        badly_formatted.stderr.contains("pipeline: FAILED at fmt"),
        "{badly_formatted}"
    );
    assert!(
        badly_formatted.output().contains("nlp.tf"),
        "fmt names the file\n{badly_formatted}"
    );
    for step in ["init", "validate", "plan", "apply"] {
        assert!(
            !badly_formatted.ran_step(step),
            "step {step} ran after fmt failed\n{badly_formatted}"
        );
    }
    assert_eq!(admin.inventory().await, applied, "nothing was applied");

    // Formatted, but with a GPU model the fleet does not have: it stops at plan, naming
    // the attribute, and nothing is applied (not even the new tenant).
    gitops.write_team("nlp.tf", NLP_TYPO);
    let typo = gitops.run(&[]);
    assert_ne!(typo.code, 0, "{typo}");
    assert!(typo.stderr.contains("pipeline: FAILED at plan"), "{typo}");
    assert!(
        typo.output()
            .contains(r#"gpu_type: unknown GPU model "H100-80G""#),
        "the plan names the attribute and the model\n{typo}"
    );
    assert!(typo.ran_step("validate"), "{typo}");
    assert!(!typo.ran_step("apply"), "{typo}");
    assert!(
        !gitops.teams_dir().join("tfplan").exists(),
        "a failed plan leaves no plan file to apply"
    );
    assert_eq!(admin.inventory().await, applied, "nothing was applied");
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_only_saves_the_plan_and_applies_nothing() {
    let backend = Backend::start();
    let gitops = Gitops::new(&backend);

    let run = gitops.run(&["--plan-only"]);
    assert_eq!(run.code, 0, "{run}");
    assert!(run.ran_step("plan"), "{run}");
    assert!(!run.ran_step("apply"), "{run}");
    let plan_file = gitops.teams_dir().join("tfplan");
    assert_eq!(
        run.pipeline_lines().last().cloned(),
        Some(format!(
            "pipeline: plan saved to {} (not applied)",
            plan_file.display()
        )),
        "{run}"
    );
    assert!(plan_file.is_file(), "the saved plan is kept for review");
    assert!(backend.admin().await.inventory().await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_token_stops_the_pipeline_before_terraform_runs() {
    let backend = Backend::start();
    let mut gitops = Gitops::new(&backend);
    gitops.token = String::new();

    let run = gitops.run(&[]);
    assert_ne!(run.code, 0, "{run}");
    assert!(
        run.stderr
            .contains("pipeline: FAILED at setup: GPUFLEET_TOKEN is not set"),
        "{run}"
    );
    assert!(!run.ran_step("fmt"), "{run}");
}

/// The lines of the guide's "Run it locally" block after its `export`s (the test sets
/// those variables itself).
fn guide_steps() -> String {
    let guide = fs::read_to_string(workspace_root().join("docs/guides/gitops.md"))
        .expect("read the GitOps guide");
    let (_, section) = guide
        .split_once("### Run it locally")
        .expect("the guide has a \"Run it locally\" section");
    let (_, block) = section.split_once("```sh\n").expect("a sh block");
    let (block, _) = block.split_once("```").expect("the block ends");
    block
        .lines()
        .filter(|l| !l.starts_with("export "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The guide's local steps, run as written from a checkout: they copy what the teams
/// need, and the three pipeline runs plan, apply, then find nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_local_steps_run_as_written() {
    let backend = Backend::start();
    let gitops = Gitops::new(&backend);
    let steps = guide_steps();
    let terraform = terraform();
    let output = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &steps])
        .current_dir(workspace_root())
        // mktemp -d makes the copy inside this test's own temp dir.
        .env("TMPDIR", gitops.root.path())
        .env("TERRAFORM", &terraform)
        .env("TF_CLI_CONFIG_FILE", &gitops.cli_config)
        .env("CHECKPOINT_DISABLE", "1")
        .env("GPUFLEET_ENDPOINT", &gitops.endpoint)
        .env("GPUFLEET_TOKEN", &gitops.token)
        .env_remove("GPUFLEET_CA_CERT_PEM")
        .env_remove("INIT_MODE")
        .env_remove("PLAN_FILE")
        .output()
        .expect("run the guide's steps");
    let run = Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    assert_eq!(run.code, 0, "{steps}\n{run}");
    let lines = run.pipeline_lines();
    assert!(lines.iter().any(|l| l == "pipeline: applied"), "{run}");
    assert_eq!(
        lines.last().map(String::as_str),
        Some("pipeline: no changes"),
        "{run}"
    );
    let inventory = backend.admin().await.inventory().await;
    for team in ["vision", "speech"] {
        let id = tenant_id(&inventory, team);
        cluster_of(&inventory, &id);
    }
}
