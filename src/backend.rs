//! The one place that knows which Burn backends exist: probing for a GPU without crashing,
//! and calling generic code (the training loop, the warm-up) with the backend type the plan
//! chose. CPU is Burn's Flex backend; CUDA is burn-cuda with autotune, with or without
//! fusion, compiled in with `--features cuda`, its convolutions as `backend.conv` says;
//! WebGPU (`--features wgpu`) is the same CubeCL code on Burn's wgpu runtime.

use crate::ops::TrainBackend;

use crate::plan::{Device, KernelPlan, Machine};

/// Work generic over the backend, handed the device and its memory query by `dispatch`.
pub trait Job {
    type Output;
    fn run<B: TrainBackend>(self, device: B::Device, mem: MemFn<B::Device>) -> Self::Output;
}

/// Runs `job` on the backend the plan chose, with its `[backend]` kernel settings (fusion
/// picks the CUDA backend type, `conv` the convolution strategy). Validation has rejected
/// CUDA where it is not compiled in, so a CPU-only binary never sees `Device::Cuda`; if it
/// does, it says so.
pub fn dispatch<J: Job>(device: Device, kernels: &KernelPlan, job: J) -> Result<J::Output, String> {
    match device {
        Device::Cpu => {
            keep_freed_memory();
            Ok(job.run::<CpuBackend>(cpu_device(), cpu_memory))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(i) => {
            crate::ops::conv_cube::set(kernels);
            crate::ops::norm_cube::set(kernels);
            crate::ops::matmul_cube::set(kernels);
            if kernels.fusion {
                Ok(job.run::<CudaBackend>(cuda_device(i), cuda_memory_fused))
            } else {
                Ok(job.run::<CudaUnfused>(cuda_device(i), cuda_memory))
            }
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => {
            let _ = kernels;
            Err("this binary was built without the `cuda` feature".into())
        }
        #[cfg(feature = "wgpu")]
        Device::Wgpu(target) => {
            crate::ops::conv_cube::set(kernels);
            crate::ops::norm_cube::set(kernels);
            crate::ops::matmul_cube::set(kernels);
            let device = wgpu_device(target);
            // Validation found the adapter; cubecl-wgpu still panics if it is gone since, or
            // if it refuses a device (on its device thread: the cause is among the panics
            // collected, before this thread's closed channel).
            if let Err(panics) = crate::clock::quietly(|| {
                <cubecl::wgpu::WgpuRuntime as cubecl::Runtime>::client(&device);
            }) {
                let cause = panics
                    .iter()
                    .find(|m| !m.contains("RecvError"))
                    .or(panics.last())
                    .cloned()
                    .unwrap_or_default();
                return Err(format!(
                    "the WebGPU adapter cannot be used ({cause}); install a Vulkan driver (on Debian, mesa-vulkan-drivers for a software one), or set backend.kind = \"cpu\""
                ));
            }
            if kernels.fusion {
                Ok(job.run::<WgpuBackend>(device, wgpu_memory_fused))
            } else {
                Ok(job.run::<WgpuUnfused>(device, wgpu_memory))
            }
        }
        #[cfg(not(feature = "wgpu"))]
        Device::Wgpu(_) => Err("this binary was built without the `wgpu` feature".into()),
    }
}

/// What this binary can run on, found without touching Burn: cudarc panics when libcuda
/// cannot be loaded, so the driver is asked directly first.
pub fn probe() -> Machine {
    let gpus = cuda_gpus();
    Machine {
        cuda_compiled: cfg!(feature = "cuda"),
        wgpu_compiled: cfg!(feature = "wgpu"),
        wgpu_adapters: cfg!(feature = "wgpu").then_some(wgpu_adapters as fn() -> _),
        cuda_devices: gpus.as_ref().map(|d| d.len()).map_err(Clone::clone),
        host_memory: crate::plan::resources::host_memory(),
        gpu_memory: gpus
            .as_ref()
            .map(|d| d.iter().map(|(_, m)| *m).collect())
            .unwrap_or_default(),
        cuda_toolchain: gpus
            .is_ok_and(|d| !d.is_empty())
            .then(cuda_toolchain)
            .flatten(),
        cpus: std::thread::available_parallelism().ok().map(|n| n.get()),
    }
}

/// The WebGPU adapters on the graphics API CubeCL uses (Vulkan on Linux), in
/// `backend.device` order: discrete GPUs, integrated, virtual, software, unknown; each
/// kind in the driver's order, which is how CubeCL counts them. Asked of wgpu directly:
/// starting CubeCL's runtime would fix its configuration before the runner sets the
/// kernel caches. Listed once per process; none in a binary without `wgpu`.
pub fn wgpu_adapters() -> Vec<crate::plan::WgpuAdapter> {
    static LISTED: std::sync::OnceLock<Vec<crate::plan::WgpuAdapter>> = std::sync::OnceLock::new();
    LISTED.get_or_init(list_wgpu_adapters).clone()
}

fn list_wgpu_adapters() -> Vec<crate::plan::WgpuAdapter> {
    #[cfg(feature = "wgpu")]
    {
        use crate::plan::AdapterKind;
        use cubecl::wgpu::GraphicsApi;
        let backend = cubecl::wgpu::AutoGraphicsApi::backend();
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: backend.into(),
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let found = cubecl::future::block_on(instance.enumerate_adapters(backend.into()));
        order_adapters(found.iter().map(|a| {
            let info = a.get_info();
            let kind = match info.device_type {
                wgpu::DeviceType::DiscreteGpu => AdapterKind::DiscreteGpu,
                wgpu::DeviceType::IntegratedGpu => AdapterKind::IntegratedGpu,
                wgpu::DeviceType::VirtualGpu => AdapterKind::VirtualGpu,
                wgpu::DeviceType::Cpu => AdapterKind::Cpu,
                wgpu::DeviceType::Other => AdapterKind::Other,
            };
            (info.name, kind)
        }))
    }
    #[cfg(not(feature = "wgpu"))]
    {
        vec![]
    }
}

/// The adapters in the driver's order → the runner's list: each one's position among
/// those of its kind (how CubeCL counts them), then the kinds in `AdapterKind` order,
/// each kind keeping the driver's order.
pub fn order_adapters(
    found: impl IntoIterator<Item = (String, crate::plan::AdapterKind)>,
) -> Vec<crate::plan::WgpuAdapter> {
    use crate::plan::{WgpuAdapter, WgpuTarget};
    let mut seen = [0usize; 5];
    let mut out: Vec<WgpuAdapter> = found
        .into_iter()
        .map(|(name, kind)| {
            let slot = kind as usize;
            seen[slot] += 1;
            WgpuAdapter {
                name,
                target: WgpuTarget {
                    index: 0,
                    kind,
                    nth: seen[slot] - 1,
                },
            }
        })
        .collect();
    out.sort_by_key(|a| a.target.kind as u8);
    for (i, a) in out.iter_mut().enumerate() {
        a.target.index = i;
    }
    out
}

/// CubeCL's name for the adapter (validation refused the kinds it cannot select).
#[cfg(feature = "wgpu")]
fn wgpu_device(t: crate::plan::WgpuTarget) -> burn::backend::wgpu::WgpuDevice {
    use crate::plan::AdapterKind;
    use burn::backend::wgpu::WgpuDevice;
    match t.kind {
        AdapterKind::DiscreteGpu => WgpuDevice::DiscreteGpu(t.nth),
        AdapterKind::IntegratedGpu => WgpuDevice::IntegratedGpu(t.nth),
        AdapterKind::VirtualGpu => WgpuDevice::VirtualGpu(t.nth),
        AdapterKind::Cpu => WgpuDevice::Cpu,
        AdapterKind::Other => WgpuDevice::DefaultDevice,
    }
}

/// Names of the CUDA devices the driver reports.
pub fn cuda_devices() -> Result<Vec<String>, String> {
    cuda_gpus().map(|d| d.into_iter().map(|(name, _)| name).collect())
}

/// The CUDA devices the driver reports: name and total memory in bytes.
pub fn cuda_gpus() -> Result<Vec<(String, u64)>, String> {
    #[cfg(feature = "cuda")]
    {
        cuda_probe::devices()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err("this binary was built without the `cuda` feature".into())
    }
}

/// The CUDA toolchain this process would compile kernels with; `None` in a binary without
/// CUDA, or where the driver cannot be loaded (`cuda_gpus` says why).
pub fn cuda_toolchain() -> Option<crate::plan::CudaToolchain> {
    #[cfg(feature = "cuda")]
    {
        cuda_probe::toolchain()
    }
    #[cfg(not(feature = "cuda"))]
    {
        None
    }
}

/// The backend's name as the run records it, and the device's.
pub fn describe(device: Device, kernels: &crate::plan::KernelPlan) -> (String, String) {
    match device {
        Device::Cpu => ("flex (cpu)".into(), cpu_name()),
        Device::Cuda(i) => (
            cube_label("cuda", kernels),
            cuda_devices()
                .ok()
                .and_then(|d| d.get(i).cloned())
                .unwrap_or_else(|| format!("CUDA device {i}")),
        ),
        Device::Wgpu(t) => (
            cube_label("wgpu", kernels),
            wgpu_adapters()
                .into_iter()
                .find(|a| a.target == t)
                .map(|a| format!("{} ({})", a.name, t.kind.name()))
                .unwrap_or_else(|| format!("WebGPU adapter {}", t.index)),
        ),
    }
}

/// `cuda (fusion, autotune balanced, conv autotune)`: a CubeCL backend and the
/// `[backend]` settings that change its kernels (the default `conv` left out).
fn cube_label(runtime: &str, kernels: &KernelPlan) -> String {
    let conv = match kernels.conv_name() {
        c if c == "implicit_gemm" => String::new(),
        c => format!(", conv {c}"),
    };
    let conv = match kernels.norm_sums {
        crate::recipe::NormSums::OnePass => conv,
        s => format!("{conv}, norm_sums {}", s.name()),
    };
    let conv = match kernels.matmul {
        crate::recipe::MatmulAlgo::Fixed => conv,
        m => format!("{conv}, matmul {}", m.name()),
    };
    // Fusion turned off by `"auto"` says so: the run was not asked to go without it.
    let fusion = match kernels.fusion_reason.strip_prefix("auto: ") {
        _ if kernels.fusion => "fusion, ".to_string(),
        Some(why) => format!(
            "no fusion: {}, ",
            why.split(" for this process").next().unwrap_or(why)
        ),
        None => String::new(),
    };
    format!(
        "{runtime} ({fusion}autotune {}{conv})",
        kernels.autotune.name(),
    )
}

/// The CPU's model name (`/proc/cpuinfo`), else the architecture.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Sets the CPU backend's thread count (0 = one per core). Only the first call takes effect.
pub fn set_cpu_threads(threads: usize) -> usize {
    if threads > 0 {
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global();
    }
    rayon::current_num_threads()
}

/// Runs `body` with the CPU backend's kernels on `threads` threads (0: one per core, or
/// `RAYON_NUM_THREADS`). The process's first run builds rayon's global pool with its count
/// and runs on the calling thread, as before; a later run of the process that asks for
/// another count (a grid over `backend.threads`, a grid's `--resume` of a cell that started
/// on other threads) runs on a pool of that size, kept for the next run that asks for it.
/// Rayon's global pool cannot be resized: every cell of such a grid ran on the first cell's
/// count, recorded as its own, so the `threads=2` cell was bitwise the `threads=1` one.
pub fn with_cpu_threads<R: Send>(threads: usize, body: impl FnOnce() -> R + Send) -> R {
    static POOLS: std::sync::Mutex<Vec<(usize, std::sync::Arc<rayon::ThreadPool>)>> =
        std::sync::Mutex::new(Vec::new());
    let global = set_cpu_threads(threads);
    let wanted = match threads {
        0 => std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        n => n,
    };
    if wanted == global {
        return body();
    }
    let pool = {
        let mut pools = POOLS.lock().unwrap_or_else(|p| p.into_inner());
        match pools.iter().find(|(n, _)| *n == wanted) {
            Some((_, pool)) => Some(pool.clone()),
            None => rayon::ThreadPoolBuilder::new()
                .num_threads(wanted)
                .thread_name(|i| format!("runner-cpu-{i}"))
                // The run's own loop runs on one of these threads: as much stack as the
                // main thread has.
                .stack_size(8 << 20)
                .build()
                .ok()
                .map(|pool| {
                    let pool = std::sync::Arc::new(pool);
                    pools.push((wanted, pool.clone()));
                    pool
                }),
        }
    };
    match pool {
        Some(pool) => pool.install(body),
        // No threads to be had: the run goes on on the global pool's, and its env.json
        // records that count.
        None => body(),
    }
}

/// Keeps freed heap memory in the process for the next step instead of returning it to the
/// operating system. A CPU step frees and re-allocates the same activation buffers
/// (megabytes each); glibc's defaults hand blocks over its mmap threshold straight back
/// and trim the heap's top, so every step page-faulted them in again, zeroed (about a tenth
/// of a ResNet step in kernel time). PyTorch's CPU allocator keeps them the same way. The
/// `trim_host` cleanup action still returns everything (`malloc_trim`).
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        const M_TRIM_THRESHOLD: i32 = -1;
        const M_MMAP_THRESHOLD: i32 = -3;
        // SAFETY: mallopt only sets two of glibc's tuning values; it takes no pointers.
        // Blocks up to 32 MiB (glibc's largest mmap threshold) come from the heap, and the
        // heap's top is trimmed only past 1 GiB free.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 32 << 20);
            mallopt(M_TRIM_THRESHOLD, 1 << 30);
        }
    }
}

/// Device memory (in use, reserved) from the backend's pool; `None` where it keeps none.
pub type MemFn<D> = fn(&D) -> Option<(u64, u64)>;

pub type CpuBackend = burn::backend::Autodiff<burn::backend::Flex>;

pub fn cpu_device() -> burn::backend::flex::FlexDevice {
    burn::backend::flex::FlexDevice
}

pub fn cpu_memory(_: &burn::backend::flex::FlexDevice) -> Option<(u64, u64)> {
    None
}

#[cfg(feature = "cuda")]
pub type CudaBackend = burn::backend::Autodiff<burn::backend::Cuda>;

/// CUDA without Burn's kernel fusion (`backend.fusion = false`).
#[cfg(feature = "cuda")]
pub type CudaUnfused =
    burn::backend::Autodiff<burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>>;

#[cfg(feature = "cuda")]
pub fn cuda_device(index: usize) -> burn::backend::cuda::CudaDevice {
    burn::backend::cuda::CudaDevice::new(index)
}

/// A CubeCL runtime's pool: (bytes in use, bytes reserved).
#[cfg(feature = "cube")]
fn cube_memory<R: cubecl::Runtime>(device: &R::Device) -> Option<(u64, u64)> {
    R::client(device)
        .memory_usage()
        .ok()
        .map(|m| (m.bytes_in_use, m.bytes_reserved))
}

/// As [`cube_memory`], with Burn's fusion in front: the ops fusion still holds in its queue
/// (a step's tail) are launched first, so the pool has made their allocations. No device
/// sync: the figures are the pool's once the queued work is on the device, as
/// `torch.cuda.memory_allocated` after a step.
#[cfg(feature = "cube")]
fn cube_memory_fused<R: burn_cubecl::CubeRuntime, BT: burn_cubecl::BoolElement>(
    device: &R::Device,
) -> Option<(u64, u64)> {
    type Cube<R, BT> = burn_cubecl::CubeBackend<R, f32, i32, BT>;
    let d = device.clone();
    burn_fusion::get_client::<Cube<R, BT>>(device).sync(move || cube_memory::<R>(&d))
}

#[cfg(feature = "cuda")]
pub fn cuda_memory(device: &burn::backend::cuda::CudaDevice) -> Option<(u64, u64)> {
    cube_memory::<cubecl::cuda::CudaRuntime>(device)
}

#[cfg(feature = "cuda")]
pub fn cuda_memory_fused(device: &burn::backend::cuda::CudaDevice) -> Option<(u64, u64)> {
    cube_memory_fused::<cubecl::cuda::CudaRuntime, u8>(device)
}

/// WebGPU (`--features wgpu`): Burn's `Wgpu` backend, with and without fusion.
#[cfg(feature = "wgpu")]
pub type WgpuBackend = burn::backend::Autodiff<burn::backend::Wgpu>;

#[cfg(feature = "wgpu")]
pub type WgpuUnfused =
    burn::backend::Autodiff<burn_cubecl::CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u32>>;

#[cfg(feature = "wgpu")]
fn wgpu_memory(device: &burn::backend::wgpu::WgpuDevice) -> Option<(u64, u64)> {
    cube_memory::<cubecl::wgpu::WgpuRuntime>(device)
}

#[cfg(feature = "wgpu")]
fn wgpu_memory_fused(device: &burn::backend::wgpu::WgpuDevice) -> Option<(u64, u64)> {
    cube_memory_fused::<cubecl::wgpu::WgpuRuntime, u32>(device)
}

#[cfg(feature = "cuda")]
mod cuda_probe {
    //! The CUDA driver API, loaded at run time: enough to count and name devices.
    use std::ffi::{c_char, c_int, c_uint, CStr};

    type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
    type CuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> c_int;
    type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
    type CuDeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
    type CuDeviceTotalMem = unsafe extern "C" fn(*mut usize, c_int) -> c_int;
    type CuDriverGetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
    type NvrtcVersion = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;

    /// The driver's CUDA version, NVRTC as CubeCL's cudarc would load it (the same file
    /// names, in the same order), and the toolkit CubeCL would take its headers from.
    pub fn toolchain() -> Option<crate::plan::CudaToolchain> {
        // SAFETY: as in `devices`; `cuDriverGetVersion` and `nvrtcVersion` take pointers
        // to ints they fill, and need no initialisation first.
        unsafe {
            let lib = libloading::Library::new("libcuda.so.1")
                .or_else(|_| libloading::Library::new("libcuda.so"))
                .ok()?;
            let version = lib
                .get::<CuDriverGetVersion>(b"cuDriverGetVersion\0")
                .ok()
                .and_then(|f| {
                    let mut v: c_int = 0;
                    (f(&mut v) == 0 && v > 0).then_some(split(v))
                });
            std::mem::forget(lib);
            let candidates = cudarc::get_lib_name_candidates("nvrtc");
            let nvrtc = candidates
                .iter()
                .find_map(|name| Some((name, libloading::Library::new(name).ok()?)))
                .ok_or_else(|| {
                    // Linux's names of it (the list also has Windows' and some twice).
                    let mut names: Vec<&str> = vec![];
                    for n in candidates.iter().filter(|n| n.starts_with("libnvrtc.so")) {
                        if !names.contains(&n.as_str()) {
                            names.push(n);
                        }
                    }
                    format!("none of {} is on the library path", names.join(", "))
                })
                .and_then(|(name, nvrtc)| {
                    let f = nvrtc
                        .get::<NvrtcVersion>(b"nvrtcVersion\0")
                        .map_err(|e| format!("{name} lacks nvrtcVersion: {e}"))?;
                    let (mut major, mut minor): (c_int, c_int) = (0, 0);
                    if f(&mut major, &mut minor) != 0 {
                        return Err(format!("{name}: nvrtcVersion failed"));
                    }
                    // CubeCL loads the same file again; kept loaded meanwhile.
                    std::mem::forget(nvrtc);
                    Ok((name.clone(), (major.max(0) as u32, minor.max(0) as u32)))
                });
            Some(crate::plan::CudaToolchain {
                driver: version,
                nvrtc,
                toolkit: cubecl::cuda::install::cuda_path(),
            })
        }
    }

    /// `cuDriverGetVersion`'s 1000 × major + 10 × minor.
    fn split(v: c_int) -> (u32, u32) {
        let v = v as u32;
        (v / 1000, (v % 1000) / 10)
    }

    /// Name and total memory (0 where the driver does not say) of each device.
    pub fn devices() -> Result<Vec<(String, u64)>, String> {
        // SAFETY: loading the system's libcuda runs its initialisers, as any CUDA program
        // does; the symbols are looked up with their documented driver-API signatures.
        unsafe {
            let lib = libloading::Library::new("libcuda.so.1")
                .or_else(|_| libloading::Library::new("libcuda.so"))
                .map_err(|e| format!("the NVIDIA driver (libcuda.so.1) cannot be loaded: {e}"))?;
            let sym = |name: &[u8]| -> Result<*const (), String> {
                lib.get::<*const ()>(name)
                    .map(|s| *s)
                    .map_err(|e| format!("libcuda lacks {}: {e}", String::from_utf8_lossy(name)))
            };
            let init: CuInit = std::mem::transmute(sym(b"cuInit\0")?);
            let count: CuDeviceGetCount = std::mem::transmute(sym(b"cuDeviceGetCount\0")?);
            let get: CuDeviceGet = std::mem::transmute(sym(b"cuDeviceGet\0")?);
            let name: CuDeviceGetName = std::mem::transmute(sym(b"cuDeviceGetName\0")?);
            let total: Option<CuDeviceTotalMem> = sym(b"cuDeviceTotalMem_v2\0")
                .ok()
                .map(|s| std::mem::transmute::<*const (), CuDeviceTotalMem>(s));
            let rc = init(0);
            if rc != 0 {
                return Err(format!(
                    "cuInit failed with CUDA error {rc} (100 means no device)"
                ));
            }
            let mut n: c_int = 0;
            if count(&mut n) != 0 {
                return Err("cuDeviceGetCount failed".into());
            }
            let mut names = vec![];
            for i in 0..n {
                let mut dev: c_int = 0;
                let mut buf = [0 as c_char; 256];
                let found = get(&mut dev, i) == 0;
                let label = if found && name(buf.as_mut_ptr(), 256, dev) == 0 {
                    CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
                } else {
                    format!("CUDA device {i}")
                };
                let mut bytes: usize = 0;
                if let (true, Some(total)) = (found, total) {
                    if total(&mut bytes, dev) != 0 {
                        bytes = 0;
                    }
                }
                names.push((label, bytes as u64));
            }
            // The library stays loaded: Burn's CUDA runtime uses the same driver.
            std::mem::forget(lib);
            Ok(names)
        }
    }
}

#[cfg(all(test, feature = "wgpu"))]
mod wgpu_tests {
    use super::*;
    use crate::plan::{AdapterKind, WgpuTarget};

    struct Nothing;

    impl Job for Nothing {
        type Output = ();
        fn run<B: TrainBackend>(self, _: B::Device, _: MemFn<B::Device>) {}
    }

    /// An adapter that cannot be started (here: a sixth discrete GPU, which CubeCL looks for
    /// on its device thread and panics there) is an error that says CubeCL's own reason,
    /// not the closed channel the calling thread sees.
    #[test]
    fn wgpu_start_failure_is_an_error_with_the_device_threads_reason() {
        let plan = KernelPlan {
            autotune: crate::recipe::AutotuneLevel::Balanced,
            fusion: false,
            fusion_reason: "backend.fusion = false".into(),
            conv: crate::recipe::ConvAlgo::Autotune,
            conv_kernel: crate::recipe::ConvKernel::SimpleSyncCyclic,
            conv_tile: crate::recipe::ConvTile::Cmma,
            conv_split: crate::recipe::ConvSplit::Auto,
            norm_sums: crate::recipe::NormSums::OnePass,
            matmul: crate::recipe::MatmulAlgo::Fixed,
            cache_dir: None,
        };
        let missing = WgpuTarget {
            index: 0,
            kind: AdapterKind::DiscreteGpu,
            nth: 5,
        };
        let e = dispatch(Device::Wgpu(missing), &plan, Nothing).unwrap_err();
        assert!(
            e.contains("No Discrete GPU device found") && !e.contains("RecvError"),
            "{e}"
        );
    }
}
