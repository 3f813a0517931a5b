//! The load tests on real GPUs, through CUDA loaded at run time.
//!
//! Why `cudarc` (0.19, features `driver cublas nvrtc cuda-13000`, dynamic loading): it
//! binds the driver API, cuBLAS and NVRTC with the libraries opened when first used, so
//! the agent builds on hosts without any CUDA (CI, this repository's machines) and runs
//! on them, saying "not run" instead of failing to start. Kernels (pattern fill and
//! verify, random operands, result comparison; [`super::kernels`]) are compiled with
//! NVRTC at run time for the device's compute capability, so no `nvcc` is needed at build
//! time either. NCCL is opened directly (`libnccl.so.2`,
//! five symbols): cudarc's loader looks for `libnccl.so`, `.so.13`, `.so.12`, ... but not
//! the `.so.2` that NCCL installs.
//!
//! Safety of a missing library: cudarc panics when a library or symbol it needs is
//! absent. [`CudaRunner::unavailable`] asks `is_culib_present` for each library first,
//! that the driver supports CUDA 13.0 (the API version compiled in) and that NVRTC is no
//! newer than the driver, and every test runs on a thread of its own whose panic becomes
//! an error, never the agent's.
//!
//! MIG slices: CUDA shows a process only the MIG devices named in its
//! `CUDA_VISIBLE_DEVICES` when it initialises, once per process; so each test of a slice
//! runs in a child (`gpufleet-agent load-probe`, [`probe_main`], protocol in
//! [`super::probe`]) with `CUDA_VISIBLE_DEVICES` set to the slice's UUID, and the agent
//! reads the GPU under load meanwhile. Whole GPUs are tested in-process, found by UUID
//! among the devices CUDA enumerates.
//!
//! Never run without a GPU: this file is compiled in CI and only exercised on a lent
//! GPU (`scripts/device-check.sh`).

use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::cublas::{result as blas_result, sys as blas_sys, CudaBlas};
use cudarc::driver::{
    sys as drv_sys, CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig,
    PushKernelArg,
};

use super::kernels;
use super::probe::{self, Answer, Test};
use super::{
    patterns, AllReduceResult, BurnResult, LoadPlan, LoadRunner, MemoryResult, Outcome, Target,
};
use crate::figures::Dtype;

/// The driver API version the bindings are compiled for (`cuda-13000`): CUDA 13.0, which
/// needs driver 580.65.06 or newer.
const CUDA_API: i32 = 13000;

/// Load tests on this host's GPUs through CUDA.
#[derive(Debug, Default)]
pub struct CudaRunner;

impl CudaRunner {
    pub fn new() -> Self {
        Self
    }
}

/// Runs `f` on a thread of its own: a panic in it (a library cudarc cannot find, a
/// symbol the driver lacks) is an error of this test, not the agent's.
fn isolated<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> Outcome<T> + Send + 'static,
) -> Outcome<T> {
    let what = what.to_string();
    std::thread::Builder::new()
        .name(format!("load-{what}"))
        .spawn(f)
        .map_err(|e| format!("{what}: cannot start a thread: {e}"))?
        .join()
        .unwrap_or_else(|panic| {
            let text = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".into());
            Err(format!("{what}: the CUDA libraries failed: {text}"))
        })
}

fn err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> String + '_ {
    move |e| format!("{what}: {e:?}")
}

/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" of a CUDA UUID.
fn uuid_text(bytes: &[std::ffi::c_char; 16]) -> String {
    let b: Vec<u8> = bytes.iter().map(|c| *c as u8).collect();
    let hex =
        |r: std::ops::Range<usize>| -> String { b[r].iter().map(|x| format!("{x:02x}")).collect() };
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

/// The context of the whole GPU `target` names; with no UUID, the one device this
/// process sees (a slice's test process).
fn context_of(target: &Target) -> Outcome<Arc<CudaContext>> {
    if target.uuid.is_empty() {
        return CudaContext::new(0).map_err(err("opening the slice's CUDA context"));
    }
    // Devices are matched by UUID without a context on each: a context holds memory on
    // its GPU, and every test of every GPU looks the devices up.
    let count = CudaContext::device_count().map_err(err("counting CUDA devices"))?;
    for ordinal in 0..count.max(0) {
        let dev = cudarc::driver::result::device::get(ordinal).map_err(err("a CUDA device"))?;
        let uuid = cudarc::driver::result::device::get_uuid(dev)
            .map_err(err("reading a CUDA device's UUID"))?;
        if uuid_text(&uuid.bytes).eq_ignore_ascii_case(&target.uuid) {
            return CudaContext::new(ordinal as usize).map_err(err("opening a CUDA context"));
        }
    }
    Err(format!(
        "{}: CUDA does not see {} (CUDA_VISIBLE_DEVICES?)",
        target.label(),
        target.uuid
    ))
}

struct Kernels {
    fill: cudarc::driver::CudaFunction,
    verify: cudarc::driver::CudaFunction,
    random: cudarc::driver::CudaFunction,
    compare: cudarc::driver::CudaFunction,
}

/// The kernels compiled for this device (PTX of its compute capability) and loaded.
fn kernels(ctx: &Arc<CudaContext>) -> Outcome<Kernels> {
    let cc = ctx
        .compute_capability()
        .map_err(err("reading the compute capability"))?;
    let ptx = kernels::compile(cc)?;
    let m = ctx.load_module(ptx).map_err(err("loading the kernels"))?;
    let f = |name: &str| m.load_function(name).map_err(err("loading a kernel"));
    Ok(Kernels {
        fill: f(kernels::FILL)?,
        verify: f(kernels::VERIFY)?,
        random: f(kernels::RANDOM_HALF)?,
        compare: f(kernels::COMPARE)?,
    })
}

fn grid() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (4096, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The largest buffer of `T` up to `want` bytes the device gives, trying 10% less each
/// time (free memory moves while the driver reserves its own).
fn alloc_most<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    want: u64,
) -> Outcome<CudaSlice<T>> {
    let size = std::mem::size_of::<T>() as u64;
    let mut bytes = want;
    while bytes >= 1 << 20 {
        if let Ok(s) = stream.alloc_zeros::<T>((bytes / size) as usize) {
            return Ok(s);
        }
        bytes = bytes / 10 * 9;
    }
    Err(format!(
        "not run: too little free memory: not even 1 MiB of the {want} bytes asked could be allocated"
    ))
}

fn memory_test(target: &Target, plan: &LoadPlan) -> Outcome<MemoryResult> {
    let ctx = context_of(target)?;
    let stream = ctx.default_stream();
    let k = kernels(&ctx)?;
    let (free, _) = ctx.mem_get_info().map_err(err("reading free memory"))?;
    let mut buf = alloc_most::<u32>(&stream, (free as f64 * plan.memory_fraction) as u64)?;
    let n = buf.len() as u64;
    let mut bad = stream.alloc_zeros::<u64>(1).map_err(err("allocating"))?;
    let mut names = Vec::new();
    let mut checked = 0;
    for p in patterns(plan) {
        let (kind, seed) = p.code();
        unsafe {
            stream
                .launch_builder(&k.fill)
                .arg(&mut buf)
                .arg(&n)
                .arg(&kind)
                .arg(&seed)
                .launch(grid())
        }
        .map_err(err("filling memory"))?;
        unsafe {
            stream
                .launch_builder(&k.verify)
                .arg(&buf)
                .arg(&n)
                .arg(&kind)
                .arg(&seed)
                .arg(&mut bad)
                .launch(grid())
        }
        .map_err(err("verifying memory"))?;
        checked += n;
        names.push(p.describe());
    }
    let mismatches = stream.clone_dtoh(&bad).map_err(err("reading the count"))?[0];
    Ok(MemoryResult {
        bytes: n * 4,
        words_checked: checked,
        mismatches,
        patterns: names,
    })
}

/// One n x n x n GEMM of half-precision operands (bf16 or fp16) into `c`, f32 compute.
fn gemm(
    blas: &CudaBlas,
    stream: &Arc<CudaStream>,
    n: i32,
    a: &CudaSlice<u16>,
    b: &CudaSlice<u16>,
    c: &mut CudaSlice<u16>,
    ty: blas_sys::cudaDataType,
) -> Outcome<()> {
    let (alpha, beta) = (1.0f32, 0.0f32);
    let (ap, _ga) = a.device_ptr(stream);
    let (bp, _gb) = b.device_ptr(stream);
    let (cp, _gc) = c.device_ptr_mut(stream);
    unsafe {
        blas_result::gemm_ex(
            *blas.handle(),
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
            n,
            n,
            n,
            &alpha as *const f32 as *const c_void,
            ap as *const c_void,
            ty,
            n,
            bp as *const c_void,
            ty,
            n,
            &beta as *const f32 as *const c_void,
            cp as *mut c_void,
            ty,
            n,
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| format!("cuBLAS GEMM: {e:?}"))
}

fn burn_test(
    target: &Target,
    dtype: Dtype,
    plan: &LoadPlan,
    tick: std::sync::mpsc::Sender<()>,
) -> Outcome<BurnResult> {
    let (ty, bf16) = match dtype {
        Dtype::Bf16 => (blas_sys::cudaDataType::CUDA_R_16BF, 1u32),
        Dtype::Fp16 => (blas_sys::cudaDataType::CUDA_R_16F, 0u32),
        Dtype::Fp32 => return Err("the burn runs bf16 or fp16 GEMMs".into()),
    };
    let ctx = context_of(target)?;
    let stream = ctx.default_stream();
    let k = kernels(&ctx)?;
    let blas = CudaBlas::new(stream.clone()).map_err(|e| format!("cuBLAS: {e:?}"))?;
    let n = super::burn_size(target.memory_mib);
    let len = (n as u64) * (n as u64);
    let alloc = || {
        stream
            .alloc_zeros::<u16>(len as usize)
            .map_err(err("allocating"))
    };
    let (mut a, mut b, mut first, mut c) = (alloc()?, alloc()?, alloc()?, alloc()?);
    for (m, seed) in [(&mut a, plan.seed), (&mut b, plan.seed ^ 1)] {
        unsafe {
            stream
                .launch_builder(&k.random)
                .arg(m)
                .arg(&len)
                .arg(&seed)
                .arg(&bf16)
                .launch(grid())
        }
        .map_err(err("random operands"))?;
    }
    gemm(&blas, &stream, n as i32, &a, &b, &mut first, ty)?;
    let timing = Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = Instant::now();
    let (mut gemms, mut compared, mut corrupted, mut gemm_ms) = (1u64, 0u64, 0u64, 0f64);
    const ROUND: usize = 8;
    loop {
        let mut bad = stream
            .alloc_zeros::<u64>(ROUND)
            .map_err(err("allocating"))?;
        let t0 = ctx.new_event(timing).map_err(err("event"))?;
        let t1 = ctx.new_event(timing).map_err(err("event"))?;
        t0.record(&stream).map_err(err("event"))?;
        for j in 0..ROUND {
            gemm(&blas, &stream, n as i32, &a, &b, &mut c, ty)?;
            let mut slot = bad.slice_mut(j..j + 1);
            unsafe {
                stream
                    .launch_builder(&k.compare)
                    .arg(&c)
                    .arg(&first)
                    .arg(&len)
                    .arg(&mut slot)
                    .launch(grid())
            }
            .map_err(err("comparing results"))?;
        }
        t1.record(&stream).map_err(err("event"))?;
        let counts = stream.clone_dtoh(&bad).map_err(err("reading the counts"))?;
        gemm_ms += f64::from(t0.elapsed_ms(&t1).map_err(err("event"))?);
        gemms += ROUND as u64;
        compared += ROUND as u64;
        corrupted += counts.iter().filter(|&&x| x > 0).count() as u64;
        let _ = tick.send(());
        if start.elapsed() >= plan.burn {
            break;
        }
    }
    let flops = 2.0 * f64::from(n).powi(3) * (gemms - 1) as f64;
    Ok(BurnResult {
        dtype,
        n,
        gemms,
        compared,
        corrupted,
        // The rounds' time includes the comparisons (about 5% at n = 8192).
        tflops: flops / (gemm_ms / 1000.0) / 1e12,
        seconds: start.elapsed().as_secs_f64(),
    })
}

fn copy_test(target: &Target, plan: &LoadPlan) -> Outcome<f64> {
    let ctx = context_of(target)?;
    let stream = ctx.default_stream();
    let (free, _) = ctx.mem_get_info().map_err(err("reading free memory"))?;
    let bytes = plan.bandwidth_bytes.min(free as u64 * 2 / 5);
    let src = alloc_most::<u8>(&stream, bytes)?;
    let mut dst = alloc_most::<u8>(&stream, src.len() as u64)?;
    let moved = src.len().min(dst.len());
    let src = src.slice(0..moved);
    let mut dst_view = dst.slice_mut(0..moved);
    stream
        .memcpy_dtod(&src, &mut dst_view)
        .map_err(err("copy"))?;
    stream.synchronize().map_err(err("copy"))?;
    const REPS: u32 = 5;
    let t = Instant::now();
    for _ in 0..REPS {
        stream
            .memcpy_dtod(&src, &mut dst_view)
            .map_err(err("copy"))?;
    }
    stream.synchronize().map_err(err("copy"))?;
    Ok(2.0 * moved as f64 * f64::from(REPS) / t.elapsed().as_secs_f64() / 1e9)
}

fn host_test(target: &Target, plan: &LoadPlan) -> Outcome<(f64, f64)> {
    let ctx = context_of(target)?;
    let stream = ctx.default_stream();
    let bytes = plan.bandwidth_bytes.min(1 << 30) as usize;
    // Plain page-locked memory, as PyTorch's pin_memory(), nvbandwidth and bandwidthTest
    // use: cudarc's alloc_pinned adds CU_MEMHOSTALLOC_WRITECOMBINED, which is not snooped
    // over PCIe and can measure faster than the figures it is held to. The host never
    // reads or writes it, so its contents do not matter.
    let mut host =
        unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }.map_err(err("pinned memory"))?;
    let mut dev = stream.alloc_zeros::<u8>(bytes).map_err(err("allocating"))?;
    const REPS: u32 = 5;
    let time = |f: &mut dyn FnMut() -> Outcome<()>| -> Outcome<f64> {
        f()?;
        stream.synchronize().map_err(err("host link"))?;
        let t = Instant::now();
        for _ in 0..REPS {
            f()?;
        }
        stream.synchronize().map_err(err("host link"))?;
        Ok(bytes as f64 * f64::from(REPS) / t.elapsed().as_secs_f64() / 1e9)
    };
    let h2d = time(&mut || {
        stream
            .memcpy_htod(&host, &mut dev)
            .map_err(err("host→device"))
    })?;
    let d2h = time(&mut || {
        stream
            .memcpy_dtoh(&dev, &mut host)
            .map_err(err("device→host"))
    })?;
    Ok((h2d, d2h))
}

/// NCCL's few symbols, opened from `libnccl.so.2`.
mod nccl {
    use std::ffi::{c_int, c_void};

    pub type Comm = *mut c_void;
    pub const FLOAT32: c_int = 7;
    pub const SUM: c_int = 0;

    pub struct Nccl {
        lib: libloading::Library,
    }

    impl Nccl {
        pub fn open() -> Result<Self, String> {
            let mut last = String::new();
            for name in ["libnccl.so.2", "libnccl.so"] {
                match unsafe { libloading::Library::new(name) } {
                    Ok(lib) => return Ok(Self { lib }),
                    Err(e) => last = e.to_string(),
                }
            }
            // "not run", as for the other CUDA libraries (the node's judge reads the prefix):
            // a host without NCCL could not run the test, it did not fail it.
            Err(format!(
                "not run: NCCL is not installed: libnccl.so.2 not found ({last})"
            ))
        }

        fn sym<T: Copy>(&self, name: &[u8]) -> Result<T, String> {
            unsafe { self.lib.get::<T>(name) }
                .map(|s| *s)
                .map_err(|e| format!("NCCL lacks {}: {e}", String::from_utf8_lossy(name)))
        }

        pub fn check(&self, what: &str, rc: c_int) -> Result<(), String> {
            if rc == 0 {
                return Ok(());
            }
            let text = self
                .sym::<unsafe extern "C" fn(c_int) -> *const std::ffi::c_char>(
                    b"ncclGetErrorString\0",
                )
                .ok()
                .map(|f| {
                    unsafe { std::ffi::CStr::from_ptr(f(rc)) }
                        .to_string_lossy()
                        .into_owned()
                })
                .unwrap_or_default();
            Err(format!("{what}: NCCL error {rc} {text}"))
        }

        pub fn init_all(&self, devices: &[c_int]) -> Result<Vec<Comm>, String> {
            let f = self.sym::<unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> c_int>(
                b"ncclCommInitAll\0",
            )?;
            let mut comms = vec![std::ptr::null_mut(); devices.len()];
            self.check("ncclCommInitAll", unsafe {
                f(comms.as_mut_ptr(), devices.len() as c_int, devices.as_ptr())
            })?;
            Ok(comms)
        }

        pub fn group(&self, start: bool) -> Result<(), String> {
            let name: &[u8] = if start {
                b"ncclGroupStart\0"
            } else {
                b"ncclGroupEnd\0"
            };
            let f = self.sym::<unsafe extern "C" fn() -> c_int>(name)?;
            self.check("ncclGroup", unsafe { f() })
        }

        /// # Safety
        /// The buffers hold `count` floats on the comm's device; `stream` is its stream.
        pub unsafe fn all_reduce(
            &self,
            send: u64,
            recv: u64,
            count: usize,
            comm: Comm,
            stream: *mut c_void,
        ) -> Result<(), String> {
            type F = unsafe extern "C" fn(
                *const c_void,
                *mut c_void,
                usize,
                c_int,
                c_int,
                Comm,
                *mut c_void,
            ) -> c_int;
            let f = self.sym::<F>(b"ncclAllReduce\0")?;
            self.check("ncclAllReduce", unsafe {
                f(
                    send as *const c_void,
                    recv as *mut c_void,
                    count,
                    FLOAT32,
                    SUM,
                    comm,
                    stream,
                )
            })
        }

        pub fn destroy(&self, comm: Comm) {
            if let Ok(f) = self.sym::<unsafe extern "C" fn(Comm) -> c_int>(b"ncclCommDestroy\0") {
                unsafe { f(comm) };
            }
        }
    }
}

fn all_reduce_test(targets: &[Target], plan: &LoadPlan) -> Outcome<AllReduceResult> {
    if targets.len() < 2 {
        return Err("an all-reduce needs two or more whole GPUs".into());
    }
    let lib = nccl::Nccl::open()?;
    let ctxs = targets
        .iter()
        .map(context_of)
        .collect::<Outcome<Vec<_>>>()?;
    let ordinals: Vec<i32> = ctxs.iter().map(|c| c.ordinal() as i32).collect();
    let streams: Vec<Arc<CudaStream>> = ctxs
        .iter()
        .map(|c| c.new_stream().map_err(err("stream")))
        .collect::<Outcome<_>>()?;
    let count = (plan.bandwidth_bytes / 4).min(1 << 28) as usize;
    let mut bufs = Vec::new();
    for s in &streams {
        let a = s.alloc_zeros::<f32>(count).map_err(err("allocating"))?;
        let b = s.alloc_zeros::<f32>(count).map_err(err("allocating"))?;
        bufs.push((a, b));
    }
    let comms = lib.init_all(&ordinals)?;
    let round = |bufs: &mut Vec<(CudaSlice<f32>, CudaSlice<f32>)>| -> Outcome<()> {
        lib.group(true)?;
        let queued = bufs.iter_mut().enumerate().try_for_each(|(i, (a, b))| {
            let (sp, _g1) = a.device_ptr(&streams[i]);
            let (rp, _g2) = b.device_ptr_mut(&streams[i]);
            unsafe {
                lib.all_reduce(
                    sp,
                    rp,
                    count,
                    comms[i],
                    streams[i].cu_stream() as *mut c_void,
                )
            }
        });
        // The group is closed even when a call failed: NCCL would otherwise stay in group
        // mode on this thread, holding what was queued, through the destruction below.
        let ended = lib.group(false);
        queued?;
        ended?;
        for s in &streams {
            s.synchronize().map_err(err("all-reduce"))?;
        }
        Ok(())
    };
    let result = (|| {
        round(&mut bufs)?;
        const REPS: u32 = 10;
        let t = Instant::now();
        for _ in 0..REPS {
            round(&mut bufs)?;
        }
        let per = t.elapsed().as_secs_f64() / f64::from(REPS);
        let bytes = (count * 4) as u64;
        let n = targets.len() as f64;
        let algbw = bytes as f64 / per / 1e9;
        Ok(AllReduceResult {
            gpus: targets.len() as u32,
            bytes,
            bus_gbps: algbw * 2.0 * (n - 1.0) / n,
        })
    })();
    for c in comms {
        lib.destroy(c);
    }
    result
}

/// `gpufleet-agent load-probe ARGS`: one test on the only device CUDA shows this process
/// (the parent set `CUDA_VISIBLE_DEVICES` to a slice); prints its one answer line.
pub fn probe_main(args: &[String]) -> String {
    let answer = (|| {
        let (test, memory_mib, plan) = probe::parse_args(args)?;
        if let Some(why) = CudaRunner::new().unavailable() {
            return Err(format!("not run: {why}"));
        }
        let t = Target {
            gpu: 0,
            uuid: String::new(),
            profile: None,
            memory_mib,
        };
        Ok(match test {
            Test::Memory => Answer::Memory(isolated("gpu_memory", move || memory_test(&t, &plan))?),
            Test::Burn(d) => {
                let (tx, _rx) = std::sync::mpsc::channel();
                Answer::Burn(isolated("gpu_burn", move || burn_test(&t, d, &plan, tx))?)
            }
            Test::Copy => Answer::Copy(isolated("hbm_bandwidth", move || copy_test(&t, &plan))?),
            Test::Host => {
                let (a, b) = isolated("host_bandwidth", move || host_test(&t, &plan))?;
                Answer::Host(a, b)
            }
        })
    })();
    probe::answer_line(&answer)
}

/// Runs `test` on a MIG slice in a child process, reading the GPU (`during`) every second
/// while it runs; bounded by the burn plus five minutes.
fn in_child(
    test: Test,
    target: &Target,
    plan: &LoadPlan,
    during: &mut dyn FnMut(),
) -> Outcome<Answer> {
    use std::io::Read;
    let exe = std::env::current_exe()
        .map_err(|e| format!("not run: cannot find the agent's binary: {e}"))?;
    let mut child = std::process::Command::new(exe)
        .arg("load-probe")
        .args(probe::args(test, target.memory_mib, plan))
        .env("CUDA_VISIBLE_DEVICES", &target.uuid)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: cannot start its test process: {e}", target.label()))?;
    let stdout = child.stdout.take().ok_or("no output pipe")?;
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.take(1 << 20).read_to_string(&mut text);
        text
    });
    let limit = plan.burn + Duration::from_secs(300);
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{}: its test process did not finish within {} s",
                    target.label(),
                    limit.as_secs()
                ));
            }
            Ok(None) => {
                during();
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => return Err(format!("waiting for the slice's test process: {e}")),
        }
    };
    let out = reader
        .join()
        .map_err(|_| "reading the slice's test process failed".to_string())?;
    // A process killed inside CUDA (a signal in the driver) answers nothing: say how it ended.
    probe::parse_answer(&out).map_err(|e| {
        if status.success() {
            e
        } else {
            format!(
                "{}: its test process ended with {status}: {e}",
                target.label()
            )
        }
    })
}

/// Why the CUDA libraries that are `(driver, cuBLAS, NVRTC)` present cannot be used, or
/// None when all are. The driver's library is named as such: without it no GPU can be
/// used at all, whatever else is installed.
fn missing_libraries((driver, cublas, nvrtc): (bool, bool, bool)) -> Option<String> {
    let missing: Vec<&str> = [
        (
            driver,
            "libcuda.so.1 (the CUDA driver, from NVIDIA's driver package)",
        ),
        (cublas, "libcublas.so.13 (cuBLAS 13)"),
        (nvrtc, "libnvrtc.so.13 (NVRTC 13)"),
    ]
    .iter()
    .filter(|(present, _)| !present)
    .map(|(_, name)| *name)
    .collect();
    (!missing.is_empty()).then(|| format!("no CUDA library: {} not found", missing.join(", ")))
}

fn wrong_answer(target: &Target) -> String {
    format!("{}: its test process answered another test", target.label())
}

impl LoadRunner for CudaRunner {
    fn kind(&self) -> &'static str {
        "cuda"
    }

    fn unavailable(&self) -> Option<String> {
        isolated("probe", || {
            let present = unsafe {
                (
                    drv_sys::is_culib_present(),
                    blas_sys::is_culib_present(),
                    cudarc::nvrtc::sys::is_culib_present(),
                )
            };
            if let Some(why) = missing_libraries(present) {
                return Err(why);
            }
            let mut version = 0;
            let rc = unsafe { drv_sys::cuDriverGetVersion(&mut version) };
            if rc != drv_sys::CUresult::CUDA_SUCCESS || version < CUDA_API {
                return Err(format!(
                    "the driver supports CUDA {}.{}; the load tests need CUDA 13.0 (driver 580.65.06 or newer)",
                    version / 1000,
                    version % 1000 / 10
                ));
            }
            // A driver loads no PTX newer than its own CUDA: a newer NVRTC's kernels would
            // all fail to load (CUDA_ERROR_UNSUPPORTED_PTX_VERSION).
            let (major, minor) = kernels::nvrtc_version()?;
            if major * 1000 + minor * 10 > version {
                return Err(format!(
                    "libnvrtc is CUDA {major}.{minor}'s, newer than the driver's CUDA {}.{}: its kernels would not load; install the NVRTC of CUDA {}.{} or a newer driver",
                    version / 1000,
                    version % 1000 / 10,
                    version / 1000,
                    version % 1000 / 10
                ));
            }
            Ok(())
        })
        .err()
    }

    fn memory(&self, target: &Target, plan: &LoadPlan) -> Outcome<MemoryResult> {
        if target.profile.is_some() {
            return match in_child(Test::Memory, target, plan, &mut || {})? {
                Answer::Memory(m) => Ok(m),
                _ => Err(wrong_answer(target)),
            };
        }
        let (t, p) = (target.clone(), plan.clone());
        isolated("gpu_memory", move || memory_test(&t, &p))
    }

    fn burn(
        &self,
        target: &Target,
        dtype: Dtype,
        plan: &LoadPlan,
        during: &mut dyn FnMut(),
    ) -> Outcome<BurnResult> {
        if target.profile.is_some() {
            return match in_child(Test::Burn(dtype), target, plan, during)? {
                Answer::Burn(b) => Ok(b),
                _ => Err(wrong_answer(target)),
            };
        }
        let (t, p) = (target.clone(), plan.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        let worker = std::thread::Builder::new()
            .name("load-gpu_burn".into())
            .spawn(move || isolated("gpu_burn", move || burn_test(&t, dtype, &p, tx)))
            .map_err(|e| format!("gpu_burn: cannot start a thread: {e}"))?;
        // Read the GPU under load each round, and at least every second.
        use std::sync::mpsc::RecvTimeoutError::Timeout;
        while let Ok(()) | Err(Timeout) = rx.recv_timeout(Duration::from_secs(1)) {
            during();
        }
        worker
            .join()
            .unwrap_or_else(|_| Err("gpu_burn: the burn thread failed".into()))
    }

    fn memory_copy(&self, target: &Target, plan: &LoadPlan) -> Outcome<f64> {
        if target.profile.is_some() {
            return match in_child(Test::Copy, target, plan, &mut || {})? {
                Answer::Copy(g) => Ok(g),
                _ => Err(wrong_answer(target)),
            };
        }
        let (t, p) = (target.clone(), plan.clone());
        isolated("hbm_bandwidth", move || copy_test(&t, &p))
    }

    fn host_link(&self, target: &Target, plan: &LoadPlan) -> Outcome<(f64, f64)> {
        if target.profile.is_some() {
            return match in_child(Test::Host, target, plan, &mut || {})? {
                Answer::Host(a, b) => Ok((a, b)),
                _ => Err(wrong_answer(target)),
            };
        }
        let (t, p) = (target.clone(), plan.clone());
        isolated("host_bandwidth", move || host_test(&t, &p))
    }

    fn all_reduce(&self, targets: &[Target], plan: &LoadPlan) -> Outcome<AllReduceResult> {
        let (t, p) = (targets.to_vec(), plan.clone());
        isolated("nccl_all_reduce", move || all_reduce_test(&t, &p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan small enough for any host (the tests here never reach a GPU's kernels).
    fn tiny_plan() -> LoadPlan {
        LoadPlan {
            memory_fraction: 0.5,
            memory_passes: 1,
            burn: Duration::from_secs(1),
            bandwidth_bytes: 1 << 20,
            seed: 1,
        }
    }

    #[test]
    fn uuids_read_as_nvml_writes_them() {
        let mut b = [0 as std::ffi::c_char; 16];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i * 17) as u8 as std::ffi::c_char;
        }
        assert_eq!(uuid_text(&b), "GPU-00112233-4455-6677-8899-aabbccddeeff");
    }

    /// On a host without CUDA (CI) the runner says why, and nothing panics.
    #[test]
    fn a_host_without_cuda_is_told_why_not_crashed() {
        let r = CudaRunner::new();
        match r.unavailable() {
            Some(why) => assert!(!why.is_empty()),
            None => eprintln!("this host has CUDA 13: the load tests can run"),
        }
        // A slice's test process on this host says why it cannot run.
        let line = probe_main(&probe::args(Test::Copy, 16_384, &tiny_plan()));
        match r.unavailable() {
            Some(_) => assert!(line.starts_with("err not run: "), "{line}"),
            None => assert!(
                line.starts_with("ok copy ") || line.starts_with("err "),
                "{line}"
            ),
        }
    }

    /// A host without NCCL cannot run the all-reduce ("not run", like a missing CUDA
    /// library), and says which library is missing.
    #[test]
    fn a_host_without_nccl_is_not_run() {
        let found = ["libnccl.so.2", "libnccl.so"]
            .iter()
            .any(|n| unsafe { libloading::Library::new(*n) }.is_ok());
        match nccl::Nccl::open() {
            Ok(_) => assert!(found),
            Err(e) => {
                assert!(!found);
                assert!(
                    e.starts_with("not run: NCCL is not installed: libnccl.so.2 not found"),
                    "{e}"
                );
            }
        }
    }

    #[test]
    fn a_missing_driver_is_named_as_the_driver() {
        assert_eq!(missing_libraries((true, true, true)), None);
        assert_eq!(
            missing_libraries((false, true, true)).as_deref(),
            Some("no CUDA library: libcuda.so.1 (the CUDA driver, from NVIDIA's driver package) not found")
        );
        assert_eq!(
            missing_libraries((true, false, false)).as_deref(),
            Some(
                "no CUDA library: libcublas.so.13 (cuBLAS 13), libnvrtc.so.13 (NVRTC 13) not found"
            )
        );
    }

    /// The real NVRTC present (scripts/bootstrap.sh's), the CUDA driver not: the runner
    /// and a slice's test process say the driver is missing, and NVRTC is not blamed.
    /// Where libcuda is present (a GPU host), the runner either can run or says why.
    #[test]
    fn with_nvrtc_but_no_driver_the_driver_is_what_is_missing() {
        kernels::use_tools_nvrtc();
        assert!(unsafe { cudarc::nvrtc::sys::is_culib_present() });
        let why = CudaRunner::new().unavailable();
        let line = probe_main(&probe::args(Test::Memory, 16_384, &tiny_plan()));
        if unsafe { drv_sys::is_culib_present() } {
            if let Some(why) = why {
                assert!(!why.contains("libnvrtc"), "{why}");
                assert_eq!(line, probe::answer_line(&Err(format!("not run: {why}"))));
            }
            return;
        }
        let why = why.expect("no driver: the load tests cannot run");
        assert!(
            why.starts_with("no CUDA library: libcuda.so.1 (the CUDA driver"),
            "{why}"
        );
        assert!(!why.contains("libnvrtc"), "{why}");
        assert!(
            line.starts_with("err not run: no CUDA library: libcuda.so.1 (the CUDA driver"),
            "{line}"
        );
    }
}
