//! The load tests' CUDA kernels (pattern fill and verify, random operands, result
//! comparison) and how they are compiled: NVRTC at run time, through `cudarc`, to PTX for
//! the device's own compute capability. One place for the source, the options and the
//! entry points, so the test that compiles them without a GPU compiles exactly what the
//! agent loads on one.

use cudarc::nvrtc::{CompileOptions, Ptx};

/// The kernels' source. `gf_word` is [`super::Pattern::word`] in CUDA C (a test compiles
/// it as C and compares the two).
pub const SOURCE: &str = r#"
extern "C" __device__ unsigned int gf_word(unsigned int kind, unsigned long long seed, unsigned long long i) {
    if (kind == 0) return 1u << ((i + seed) & 31);
    if (kind == 1) return ~(1u << ((i + seed) & 31));
    unsigned long long z = seed + i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (unsigned int)(z ^ (z >> 31));
}
extern "C" __global__ void gf_fill(unsigned int* p, unsigned long long n, unsigned int kind, unsigned long long seed) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        p[i] = gf_word(kind, seed, i);
}
extern "C" __global__ void gf_verify(const unsigned int* p, unsigned long long n, unsigned int kind, unsigned long long seed, unsigned long long* bad) {
    unsigned long long mine = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        if (p[i] != gf_word(kind, seed, i)) mine++;
    if (mine) atomicAdd(bad, mine);
}
extern "C" __global__ void gf_random_half(unsigned short* p, unsigned long long n, unsigned long long seed, unsigned int bf16) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        float f = (float)(gf_word(2, seed, i) >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
        if (bf16) { p[i] = (unsigned short)(__float_as_uint(f) >> 16); }
        else {
            unsigned int b = __float_as_uint(f);
            unsigned int sign = (b >> 16) & 0x8000u;
            int e = (int)((b >> 23) & 0xff) - 127 + 15;
            unsigned int m = (b >> 13) & 0x3ffu;
            p[i] = (unsigned short)(e <= 0 ? sign : (sign | ((unsigned int)e << 10) | m));
        }
    }
}
extern "C" __global__ void gf_compare(const unsigned short* a, const unsigned short* b, unsigned long long n, unsigned long long* bad) {
    unsigned long long mine = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        if (a[i] != b[i]) mine++;
    if (mine) atomicAdd(bad, mine);
}
"#;

/// The entry points the launch code looks up, by name.
pub const FILL: &str = "gf_fill";
pub const VERIFY: &str = "gf_verify";
pub const RANDOM_HALF: &str = "gf_random_half";
pub const COMPARE: &str = "gf_compare";
pub const ENTRY_POINTS: [&str; 4] = [FILL, VERIFY, RANDOM_HALF, COMPARE];

/// NVRTC's options for a device of compute capability `(major, minor)`: PTX for exactly
/// that virtual architecture (NVRTC's default changes between releases: compute_52 in
/// CUDA 12, compute_75 in 13), so what is tested here is what a GPU gets.
pub fn options((major, minor): (i32, i32)) -> CompileOptions {
    CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
        ..Default::default()
    }
}

/// The kernels as PTX for a device of compute capability `cc`.
pub fn compile(cc: (i32, i32)) -> Result<Ptx, String> {
    cudarc::nvrtc::compile_ptx_with_opts(SOURCE, options(cc)).map_err(|e| format!("NVRTC: {e}"))
}

/// The NVRTC library's version, (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32), String> {
    let (mut major, mut minor) = (0, 0);
    let rc = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("NVRTC: nvrtcVersion: {rc:?}"));
    }
    Ok((major, minor))
}

/// Loads the NVRTC that `scripts/bootstrap.sh` installs (`.tools/venv-cuda`, PyPI's
/// nvidia-cuda-nvrtc) into this test process, so that cudarc's loader finds it by its
/// name (`libnvrtc.so.13`) as it finds the system's on a GPU host: the dynamic linker
/// matches an already loaded library by its soname. The builtins library is loaded first
/// because libnvrtc opens it by name too, and the wheel's folder is on no search path.
/// Panics, saying what to install, where no libnvrtc can be found at all.
#[cfg(test)]
pub(crate) fn use_tools_nvrtc() {
    use std::sync::OnceLock;
    static LOADED: OnceLock<Vec<libloading::Library>> = OnceLock::new();
    LOADED.get_or_init(|| {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let root = root.canonicalize().unwrap_or(root);
        let venv_lib = root.join(".tools/venv-cuda/lib");
        let dir = std::fs::read_dir(&venv_lib)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("site-packages/nvidia/cu13/lib"))
            .find(|d| d.join("libnvrtc.so.13").is_file());
        let Some(dir) = dir else {
            assert!(
                unsafe { cudarc::nvrtc::sys::is_culib_present() },
                "libnvrtc.so.13 (NVRTC 13) not found: neither under {} nor on the library \
                 path; run scripts/bootstrap.sh (installs PyPI's nvidia-cuda-nvrtc into \
                 .tools/venv-cuda)",
                venv_lib.display()
            );
            return Vec::new();
        };
        ["libnvrtc-builtins.so.13.0", "libnvrtc.so.13"]
            .iter()
            .map(|name| {
                let path = dir.join(name);
                unsafe { libloading::Library::new(&path) }
                    .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
            })
            .collect()
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::Pattern;

    /// The compute capability of each catalog model (a new model fails here until added).
    fn compute_capability(model: &str) -> (i32, i32) {
        match model {
            m if m.starts_with("A100") => (8, 0),
            "L40S" => (8, 9),
            m if m.starts_with("H100") || m.starts_with("H200") || m == "GH200" => (9, 0),
            "B200" => (10, 0),
            other => panic!("the compute capability of catalog model {other} is not known here"),
        }
    }

    /// The kernels compile with the real NVRTC (CUDA 13.0, no GPU needed), with the options
    /// the agent uses, for the architecture of every catalog model; the PTX defines every
    /// entry point the launch code looks up, for that architecture, in a PTX version a
    /// CUDA 13.0 driver (580.65.06, the agent's minimum) can load.
    #[test]
    fn the_kernels_compile_with_nvrtc_for_every_catalog_model() {
        use_tools_nvrtc();
        let version = nvrtc_version().expect("the NVRTC version");
        assert!(
            version >= (13, 0),
            "NVRTC {version:?}: the agent targets CUDA 13"
        );
        let mut archs: Vec<(i32, i32)> = crate::catalog::models()
            .iter()
            .map(|m| compute_capability(&m.name))
            .collect();
        archs.sort();
        archs.dedup();
        assert!(
            archs.contains(&(9, 0)),
            "H100 and H200 are sm_90: {archs:?}"
        );
        for (major, minor) in archs {
            let ptx = compile((major, minor))
                .unwrap_or_else(|e| panic!("compute_{major}{minor}: {e}"))
                .to_src();
            let target = format!(".target sm_{major}{minor}");
            assert!(
                ptx.lines().any(|l| l.trim() == target),
                "{target} in the PTX"
            );
            // PTX ISA 9.0 is CUDA 13.0's; a driver loads no newer PTX than its own.
            let isa = ptx
                .lines()
                .find_map(|l| l.trim().strip_prefix(".version "))
                .expect(".version in the PTX");
            assert_eq!(isa.trim(), "9.0", "PTX ISA of NVRTC {version:?}");
            for name in ENTRY_POINTS {
                let entry = format!(".visible .entry {name}(");
                assert!(
                    ptx.contains(&entry),
                    "compute_{major}{minor}: {entry} in the PTX"
                );
            }
        }
    }

    /// NVRTC rejects what is wrong: the check above would see a broken kernel.
    #[test]
    fn nvrtc_reports_a_kernel_that_does_not_compile() {
        use_tools_nvrtc();
        let e = cudarc::nvrtc::compile_ptx_with_opts(
            "extern \"C\" __global__ void k(int* p) { p[0] = undefined_name; }",
            options((9, 0)),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("undefined_name"), "{e}");
    }

    /// `gf_word`, compiled from the kernels' own source as plain C with the host's C
    /// compiler and given what the kernels are given (`Pattern::code`), computes the same
    /// words as `Pattern::word`: what the memory test writes on a GPU is what the simulator
    /// writes and what the docs say.
    #[test]
    fn gf_word_in_cuda_c_is_pattern_word() {
        use std::io::Write;
        let start = SOURCE
            .find("unsigned int gf_word(")
            .expect("gf_word in the source");
        let end = start + SOURCE[start..].find("\n}\n").expect("gf_word's end") + 3;
        let program = format!(
            "#include <stdio.h>\n{}\nint main(void) {{\n\
             unsigned int kind; unsigned long long seed, i;\n\
             while (scanf(\"%u %llu %llu\", &kind, &seed, &i) == 3) printf(\"%u\\n\", gf_word(kind, seed, i));\n\
             return 0;\n}}\n",
            &SOURCE[start..end]
        );
        let dir = tempfile::tempdir().unwrap();
        let (c, exe) = (dir.path().join("gf_word.c"), dir.path().join("gf_word"));
        std::fs::write(&c, program).unwrap();
        let cc = std::process::Command::new("cc")
            .arg("-O2")
            .arg("-o")
            .arg(&exe)
            .arg(&c)
            .output()
            .expect("the host's C compiler, cc");
        assert!(
            cc.status.success(),
            "{}",
            String::from_utf8_lossy(&cc.stderr)
        );

        let patterns = [
            Pattern::WalkingOnes(0),
            Pattern::WalkingOnes(5),
            Pattern::WalkingZeros(0),
            Pattern::WalkingZeros(u32::MAX),
            Pattern::Random(0),
            Pattern::Random(1),
            Pattern::Random(u64::MAX),
            Pattern::Random(0x0123_4567_89AB_CDEF),
        ];
        // Small indices, and large ones (a 141 GB buffer holds 35 G words).
        let indices: Vec<u64> = (0..500)
            .chain((0..500).map(|i| i * 70_368_744_177 + 3))
            .collect();
        let mut input = String::new();
        let mut expected = Vec::new();
        for p in patterns {
            let (kind, seed) = p.code();
            for &i in &indices {
                input.push_str(&format!("{kind} {seed} {i}\n"));
                expected.push(p.word(i));
            }
        }
        let mut child = std::process::Command::new(&exe)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let got: Vec<u32> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        assert_eq!(got.len(), 8_000);
        assert_eq!(got, expected);
    }
}
