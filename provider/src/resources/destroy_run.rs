//! Whether the Terraform command this provider process serves destroys
//! (`terraform destroy`, `terraform apply -destroy`, `terraform plan -destroy`).
//!
//! A destroy first refreshes through a plan in normal mode, which plans every resource of
//! the configuration, creates included: a create's dry run refused there (a reservation
//! whose create failed in the last apply and that no longer fits) would refuse the destroy
//! itself. A destroy creates nothing, so its plans skip create dry runs. Terraform tells a
//! provider nothing of the command, so this reads the command line of the process that
//! started the provider (Terraform) once; where it cannot be read (not Linux), false,
//! and such a destroy runs the dry runs as before (`-refresh=false` skips them).

use std::sync::OnceLock;

/// Whether this provider serves a destroy (read once per process).
pub fn destroying() -> bool {
    static DESTROYING: OnceLock<bool> = OnceLock::new();
    *DESTROYING.get_or_init(|| terraform_args().is_some_and(|args| is_destroy(&args)))
}

/// The parent process's arguments (a few bytes of procfs).
fn terraform_args() -> Option<Vec<String>> {
    let parent = std::os::unix::process::parent_id();
    let raw = std::fs::read(format!("/proc/{parent}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// Terraform's commands: the first argument that is one names the command (what comes
/// before it is the program, or a wrapper and its script, e.g. `python3 .../terraform`).
const COMMANDS: &[&str] = &[
    "apply",
    "console",
    "destroy",
    "fmt",
    "force-unlock",
    "get",
    "graph",
    "import",
    "init",
    "login",
    "logout",
    "metadata",
    "modules",
    "output",
    "plan",
    "providers",
    "query",
    "refresh",
    "show",
    "state",
    "taint",
    "test",
    "untaint",
    "validate",
    "version",
    "workspace",
];

/// Whether Terraform's arguments run a destroy: the `destroy` command, or the `-destroy`
/// option (of `apply` or `plan`).
fn is_destroy(args: &[String]) -> bool {
    let mut command = None;
    for arg in args {
        if arg.starts_with('-') {
            let option = arg.trim_start_matches('-');
            if command.is_some() && (option == "destroy" || option == "destroy=true") {
                return true;
            }
        } else if command.is_none() && COMMANDS.contains(&arg.as_str()) {
            command = Some(arg.as_str());
        }
    }
    command == Some("destroy")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn destroys_are_told_from_other_commands() {
        for line in [
            "terraform destroy -auto-approve",
            "/usr/bin/terraform -chdir=infra destroy",
            "terraform apply -destroy -auto-approve",
            "terraform plan --destroy -out=p",
            "terraform apply -destroy=true",
            "/usr/bin/python3 /opt/tools/bin/terraform destroy -no-color",
        ] {
            assert!(is_destroy(&args(line)), "{line}");
        }
        for line in [
            "terraform plan",
            "terraform apply -auto-approve",
            "terraform apply destroy.tfplan",
            "terraform plan -destroy=false",
            "terraform",
            "python3 -destroy terraform plan",
        ] {
            assert!(!is_destroy(&args(line)), "{line}");
        }
    }
}
