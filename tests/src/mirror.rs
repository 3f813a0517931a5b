//! The provider under test as an operator installs it: `scripts/release.sh` run on the
//! built binaries, and its provider mirror used with `terraform init` (no
//! `dev_overrides`). Made once per build of the provider and kept under the binaries'
//! directory (`e2e-release/<size>-<mtime>`), so test processes share it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::binaries::{agent, provider};

/// The release's `mirror/` directory for the provider under test.
pub fn release_mirror() -> &'static Path {
    static MIRROR: OnceLock<PathBuf> = OnceLock::new();
    MIRROR.get_or_init(make).as_path()
}

/// A CLI configuration that installs gpufleet/gpufleet from `mirror` only (and anything
/// else from the registry).
pub fn cli_config(mirror: &Path) -> String {
    format!(
        "provider_installation {{\n  filesystem_mirror {{\n    path    = \"{}\"\n    include = [\"registry.terraform.io/gpufleet/gpufleet\"]\n  }}\n  direct {{\n    exclude = [\"registry.terraform.io/gpufleet/gpufleet\"]\n  }}\n}}\n",
        mirror.display()
    )
}

/// Runs scripts/release.sh on the binaries under test (linked or copied into
/// `out/binaries`) into `out`, as an operator's release build would package them.
pub fn release(out: &Path) {
    release_with(out, &[]);
}

/// [`release`] with more environment (e.g. a signing key).
pub fn release_with(out: &Path, env: &[(&str, &str)]) {
    let binaries = out.join("binaries");
    std::fs::create_dir_all(&binaries).unwrap();
    for b in [agent(), provider()] {
        let to = binaries.join(b.file_name().unwrap());
        if std::fs::hard_link(&b, &to).is_err() {
            std::fs::copy(&b, &to).unwrap_or_else(|e| panic!("copy {}: {e}", b.display()));
        }
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/release.sh");
    let run = Command::new(&script)
        .arg(out)
        .env("GPUFLEET_RELEASE_BINARIES", &binaries)
        .envs(env.iter().copied())
        .output()
        .expect("run scripts/release.sh");
    assert!(
        run.status.success(),
        "scripts/release.sh failed:\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
}

fn make() -> PathBuf {
    let provider = provider();
    let meta = std::fs::metadata(&provider)
        .unwrap_or_else(|e| panic!("{}: {e} (build it first)", provider.display()));
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let base = provider.parent().unwrap().join("e2e-release");
    let done = base.join(format!("{}-{modified}", meta.len()));
    if done.join("mirror").is_dir() {
        return done.join("mirror");
    }
    // Built beside, then renamed into place: another test process may be at it too.
    let work = base.join(format!(".{}-{modified}-{}", meta.len(), std::process::id()));
    let out = work.join("out");
    release(&out);
    std::fs::create_dir_all(&done).unwrap();
    if std::fs::rename(out.join("mirror"), done.join("mirror")).is_err()
        && !done.join("mirror").is_dir()
    {
        panic!("cannot put the release mirror at {}", done.display());
    }
    let _ = std::fs::remove_dir_all(&work);
    done.join("mirror")
}
