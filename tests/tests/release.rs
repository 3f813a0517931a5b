//! A release as an operator installs it (`scripts/release.sh`): `terraform init` installs
//! the provider from the release's mirror, used as a directory (`filesystem_mirror`) and
//! served over https (`network_mirror`), and the installed provider plans against a real
//! backend; the agent's tarball holds a binary that runs, its service units and
//! environment files.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gpufleet_e2e::binaries::{agent, terraform, workspace_root};
use gpufleet_e2e::mirror::{release, release_with};
use gpufleet_e2e::Backend;

/// The workspace's version, as the release names its files.
fn version() -> String {
    let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
    let package = manifest
        .split("[workspace.package]")
        .nth(1)
        .expect("a [workspace.package] table");
    package
        .lines()
        .find_map(|l| l.trim().strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("a version in [workspace.package]")
        .to_string()
}

/// `terraform ARGS` in `dir` with the CLI configuration `cli` (and more environment);
/// its exit status and output.
fn tf(dir: &Path, cli: &Path, env: &[(&str, &str)], args: &[&str]) -> (bool, String) {
    let out = Command::new(terraform())
        .args(args)
        .current_dir(dir)
        .env("TF_CLI_CONFIG_FILE", cli)
        .env("CHECKPOINT_DISABLE", "1")
        .env("TF_IN_AUTOMATION", "1")
        .envs(env.iter().copied())
        .output()
        .expect("run terraform");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A configuration that pins the released version and reads the fleet's GPU models.
fn write_config(dir: &Path, backend: &Backend, version: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("main.tf"),
        format!(
            r#"
terraform {{
  required_providers {{
    gpufleet = {{
      source  = "gpufleet/gpufleet"
      version = "{version}"
    }}
  }}
}}
provider "gpufleet" {{
  endpoint = "{endpoint}"
}}
data "gpufleet_gpu_types" "all" {{}}
output "models" {{
  value = [for t in data.gpufleet_gpu_types.all.gpu_types : t.name]
}}
"#,
            endpoint = backend.endpoint()
        ),
    )
    .unwrap();
}

/// A static https server of `root` (Terraform takes network mirrors over https only),
/// with a certificate of the pki's own CA; killed when dropped.
struct Https {
    child: std::process::Child,
    port: u16,
}

impl Https {
    fn serve(root: &Path, pki: &Path) -> Https {
        let script = r#"
import http.server, os, ssl, sys
os.chdir(sys.argv[1])
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[2], sys.argv[3])
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(root)
            .arg(pki.join("server.pem"))
            .arg(pki.join("server.key"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 (Debian's, which the bootstrap's venv needs too)");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let port = line.trim().parse().unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("the https server did not start: {line:?}")
        });
        Https { child, port }
    }
}

impl Drop for Https {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn terraform_init_installs_the_released_provider_from_its_mirror() {
    let version = version();
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("release");
    release(&out);
    let zip = format!("terraform-provider-gpufleet_{version}_linux_amd64.zip");
    let sums = std::fs::read_to_string(
        out.join(format!("terraform-provider-gpufleet_{version}_SHA256SUMS")),
    )
    .unwrap();
    let zip_sha = sums
        .lines()
        .find_map(|l| l.strip_suffix(&format!("  {zip}")))
        .unwrap_or_else(|| panic!("no sum of {zip} in {sums}"))
        .to_string();

    let backend = Backend::start();
    let token = [("GPUFLEET_TOKEN", backend.admin_token())];
    // As a directory.
    let cli = work.path().join("fs.tfrc");
    std::fs::write(
        &cli,
        format!(
            "provider_installation {{\n  filesystem_mirror {{\n    path    = \"{}\"\n    include = [\"registry.terraform.io/gpufleet/gpufleet\"]\n  }}\n  direct {{ exclude = [\"registry.terraform.io/gpufleet/gpufleet\"] }}\n}}\n",
            out.join("mirror").display()
        ),
    )
    .unwrap();
    let dir = work.path().join("fs");
    write_config(&dir, &backend, &version);
    let (ok, text) = tf(&dir, &cli, &token, &["init", "-no-color", "-input=false"]);
    assert!(ok, "terraform init from the filesystem mirror:\n{text}");
    assert!(
        text.contains(&format!("Installed gpufleet/gpufleet v{version}")),
        "{text}"
    );
    let lock = std::fs::read_to_string(dir.join(".terraform.lock.hcl")).unwrap();
    assert!(
        lock.contains(&format!("version     = \"{version}\"")),
        "{lock}"
    );
    let (ok, text) = tf(
        &dir,
        &cli,
        &token,
        &["apply", "-auto-approve", "-no-color", "-input=false"],
    );
    assert!(ok, "the installed provider's apply:\n{text}");
    assert!(text.contains("H100-80GB"), "{text}");

    // Served over https as a network mirror: the lock records the zip's hash from the
    // release's SHA256SUMS.
    let pki = work.path().join("pki");
    let issued = Command::new(agent())
        .args(["pki", "--dir"])
        .arg(&pki)
        .args(["--server-name", "localhost"])
        .output()
        .unwrap();
    assert!(issued.status.success());
    let server = Https::serve(&out.join("mirror"), &pki);
    let cli = work.path().join("net.tfrc");
    std::fs::write(
        &cli,
        format!(
            "provider_installation {{\n  network_mirror {{\n    url     = \"https://localhost:{}/\"\n    include = [\"registry.terraform.io/gpufleet/gpufleet\"]\n  }}\n  direct {{ exclude = [\"registry.terraform.io/gpufleet/gpufleet\"] }}\n}}\n",
            server.port
        ),
    )
    .unwrap();
    let dir = work.path().join("net");
    write_config(&dir, &backend, &version);
    let ca = pki.join("ca.pem");
    let env = [
        ("GPUFLEET_TOKEN", backend.admin_token()),
        ("SSL_CERT_FILE", ca.to_str().unwrap()),
    ];
    let (ok, text) = tf(&dir, &cli, &env, &["init", "-no-color", "-input=false"]);
    assert!(ok, "terraform init from the network mirror:\n{text}");
    // The same package as from the directory: the same hash in the lock file.
    let net_lock = std::fs::read_to_string(dir.join(".terraform.lock.hcl")).unwrap();
    let h1 = |lock: &str| {
        lock.lines()
            .find(|l| l.contains("\"h1:"))
            .map(|l| l.trim().to_string())
    };
    assert!(h1(&net_lock).is_some());
    assert_eq!(h1(&net_lock), h1(&lock), "{net_lock}");
    let (ok, text) = tf(&dir, &cli, &env, &["plan", "-no-color", "-input=false"]);
    assert!(
        ok,
        "plan with the provider from the network mirror:\n{text}"
    );
    // Terraform checks the zip against the mirror's hash (the release's SHA256SUMS): a
    // mirror whose hash does not match is refused.
    let listing = out
        .join("mirror/registry.terraform.io/gpufleet/gpufleet")
        .join(format!("{version}.json"));
    let json = std::fs::read_to_string(&listing).unwrap();
    assert!(json.contains(&format!("zh:{zip_sha}")), "{json}");
    std::fs::write(&listing, json.replace(&zip_sha, &"0".repeat(64))).unwrap();
    let dir = work.path().join("tampered");
    write_config(&dir, &backend, &version);
    let (ok, text) = tf(&dir, &cli, &env, &["init", "-no-color", "-input=false"]);
    assert!(!ok, "a mirror with a wrong hash must be refused:\n{text}");
    assert!(text.contains("checksum"), "{text}");
}

#[test]
fn the_agent_tarball_holds_a_binary_that_runs_its_units_and_environment_files() {
    let version = version();
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("release");
    release(&out);
    let tarball = out.join(format!("gpufleet-agent_{version}_linux_amd64.tar.gz"));
    let unpacked = work.path().join("unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    let tar = Command::new("tar")
        .arg("-xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(&unpacked)
        .status()
        .unwrap();
    assert!(tar.success());
    let top: PathBuf = unpacked.join(format!("gpufleet-agent_{version}_linux_amd64"));
    let help = Command::new(top.join("bin/gpufleet-agent"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("GPUFLEET_ADMIN_TOKEN"));
    for file in [
        "systemd/gpufleet-serve.service",
        "systemd/gpufleet-node.service",
        "serve.env.example",
        "node.env.example",
        "INSTALL",
    ] {
        assert!(top.join(file).is_file(), "{file} is not in the tarball");
    }
    // The units run the binary where INSTALL puts it.
    let install = std::fs::read_to_string(top.join("INSTALL")).unwrap();
    let unit = std::fs::read_to_string(top.join("systemd/gpufleet-serve.service")).unwrap();
    assert!(
        install.contains("/usr/local/bin/")
            && unit.contains("ExecStart=/usr/local/bin/gpufleet-agent serve")
    );
    let sums =
        std::fs::read_to_string(out.join(format!("gpufleet-agent_{version}_SHA256SUMS"))).unwrap();
    let check = Command::new("sha256sum")
        .args(["--check", "--strict"])
        .current_dir(&out)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(sums.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(check.status.success(), "{sums}");
}

/// `gpg ARGS` with the keyring in `home`: whether it succeeded, and what it said.
fn gpg(home: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("gpg")
        .args(["--batch", "--quiet", "--homedir"])
        .arg(home)
        .args(args)
        .output()
        .expect("gpg (Debian's gnupg)");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn a_configured_signing_key_signs_the_providers_sums_and_the_signature_checks() {
    use std::os::unix::fs::PermissionsExt;
    let version = version();
    let work = tempfile::tempdir().unwrap();
    let home = work.path().join("gnupg");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    let uid = "gpufleet release test <release@example.invalid>";
    let (made, text) = gpg(
        &home,
        &[
            "--passphrase",
            "",
            "--quick-gen-key",
            uid,
            "ed25519",
            "sign",
            "never",
        ],
    );
    assert!(made, "a throwaway signing key: {text}");

    let out = work.path().join("release");
    let home_text = home.display().to_string();
    release_with(
        &out,
        &[
            ("GPUFLEET_RELEASE_SIGNING_KEY", "release@example.invalid"),
            ("GNUPGHOME", &home_text),
        ],
    );
    let sums = out.join(format!("terraform-provider-gpufleet_{version}_SHA256SUMS"));
    let sig = out.join(format!(
        "terraform-provider-gpufleet_{version}_SHA256SUMS.sig"
    ));
    let (verified, text) = gpg(
        &home,
        &["--verify", sig.to_str().unwrap(), sums.to_str().unwrap()],
    );
    assert!(verified, "the signature checks: {text}");
    // A changed SHA256SUMS no longer matches it.
    let mut tampered = std::fs::read_to_string(&sums).unwrap();
    tampered.replace_range(0..1, if tampered.starts_with('0') { "1" } else { "0" });
    std::fs::write(&sums, tampered).unwrap();
    let (verified, _) = gpg(
        &home,
        &["--verify", sig.to_str().unwrap(), sums.to_str().unwrap()],
    );
    assert!(!verified, "a changed SHA256SUMS fails the check");

    // Without a key nothing is signed.
    let unsigned = work.path().join("unsigned");
    release(&unsigned);
    assert!(!unsigned
        .join(format!(
            "terraform-provider-gpufleet_{version}_SHA256SUMS.sig"
        ))
        .exists());
}
