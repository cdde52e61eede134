//! Which device a recipe's backend gets: WebGPU adapters as CubeCL counts them, and a CUDA
//! device only with what compiles its kernels.

use std::path::Path;

use runner::plan::Machine;

use crate::common::{any_machine, root};

/// `backend.kind = "wgpu"` picks the adapter `backend.device` names among those found, in
/// the order the runner lists them, and refuses what CubeCL cannot start before a run
/// directory exists: no adapter, an index past the list, a second software adapter.
#[test]
fn webgpu_adapter_is_the_one_backend_device_names_or_a_clear_error() {
    use runner::plan::{AdapterKind, Device, WgpuAdapter, WgpuTarget};
    fn adapter(index: usize, name: &str, kind: AdapterKind, nth: usize) -> WgpuAdapter {
        WgpuAdapter {
            name: name.into(),
            target: WgpuTarget { index, kind, nth },
        }
    }
    let machine = |adapters: fn() -> Vec<WgpuAdapter>| Machine {
        wgpu_adapters: Some(adapters),
        ..any_machine()
    };
    let two = machine(|| {
        vec![
            adapter(0, "NVIDIA H200", AdapterKind::DiscreteGpu, 0),
            adapter(1, "llvmpipe", AdapterKind::Cpu, 0),
            adapter(2, "SwiftShader", AdapterKind::Cpu, 1),
        ]
    });
    let check_with = |sets: &[&str], m: &Machine| {
        let mut all = vec!["backend.kind=\"wgpu\"".to_string()];
        all.extend(sets.iter().map(|s| s.to_string()));
        runner::sweep::check(Path::new("recipes/quickstart.toml"), &all, m, 16)
            .map(|c| c.plans.into_iter().next().unwrap())
    };
    std::env::set_current_dir(root()).unwrap();

    let p = check_with(&["backend.device=1"], &two).expect("adapter 1 exists");
    assert_eq!(
        p.device,
        Device::Wgpu(WgpuTarget {
            index: 1,
            kind: AdapterKind::Cpu,
            nth: 0
        })
    );
    assert!(
        p.device_reason.contains("adapter 1 of 3, llvmpipe"),
        "{}",
        p.device_reason
    );
    let p = check_with(&[], &two).expect("adapter 0 exists");
    assert!(matches!(p.device, Device::Wgpu(t) if t.kind == AdapterKind::DiscreteGpu));

    let err = |sets: &[&str], m: &Machine| check_with(sets, m).unwrap_err().to_string();
    let e = err(&["backend.device=3"], &two);
    assert!(
        e.contains("backend.device")
            && e.contains("WebGPU adapter 3 does not exist: 3 found")
            && e.contains("1: llvmpipe (software, on the CPU)"),
        "{e}"
    );
    let e = err(&["backend.device=2"], &two);
    assert!(
        e.contains("CubeCL selects only the first") && e.contains("use device 1"),
        "{e}"
    );
    let other = machine(|| vec![adapter(0, "mystery", AdapterKind::Other, 0)]);
    let e = err(&[], &other);
    assert!(
        e.contains("backend.device") && e.contains("cannot select reliably"),
        "{e}"
    );
    let e = err(&[], &machine(Vec::new));
    assert!(
        e.contains("backend.kind")
            && e.contains("no adapter was found")
            && e.contains("mesa-vulkan-drivers"),
        "{e}"
    );
    // A software adapter computes in host memory: the model and activations are checked
    // against it, as on the CPU; a GPU adapter's are not (its memory is its own).
    // (Room for the data and the batches the loader holds ahead, 77 MB here, not more.)
    let small_host = |adapters: fn() -> Vec<WgpuAdapter>| Machine {
        host_memory: Some(runner::plan::HostMemory::machine(256 << 20)),
        ..machine(adapters)
    };
    let batch = ["loader.batch_size=8192", "data.limit=256"];
    let e = err(
        &[&batch[..], &["backend.device=1"]].concat(),
        &small_host(two.wgpu_adapters.unwrap()),
    );
    assert!(
        e.contains("loader.batch_size") && e.contains("more than this machine's memory"),
        "{e}"
    );
    check_with(&batch, &small_host(two.wgpu_adapters.unwrap()))
        .expect("a GPU adapter's activations are not in host memory");
    // pin_memory has no staging memory to use there: a warning, not an error.
    let p = check_with(&["loader.pin_memory=true"], &two).unwrap();
    let warnings: Vec<String> = p.warnings.iter().map(|w| w.to_string()).collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("loader.pin_memory") && w.contains("WebGPU")),
        "{warnings:?}"
    );
}

/// The runner lists WebGPU adapters discrete first and software last, and names each by
/// its position among those of its kind in the driver's order, which is how CubeCL's
/// `WgpuDevice::DiscreteGpu(n)` and the others count.
#[test]
fn webgpu_adapters_are_listed_by_kind_and_counted_as_cubecl_counts_them() {
    use runner::plan::AdapterKind::*;
    let found = [
        ("lavapipe", Cpu),
        ("A100", DiscreteGpu),
        ("mystery", Other),
        ("Iris", IntegratedGpu),
        ("H200", DiscreteGpu),
    ];
    let listed = runner::backend::order_adapters(found.map(|(n, k)| (n.to_string(), k)));
    let got: Vec<(usize, &str, _, usize)> = listed
        .iter()
        .map(|a| (a.target.index, a.name.as_str(), a.target.kind, a.target.nth))
        .collect();
    assert_eq!(
        got,
        [
            (0, "A100", DiscreteGpu, 0),
            (1, "H200", DiscreteGpu, 1),
            (2, "Iris", IntegratedGpu, 0),
            (3, "lavapipe", Cpu, 0),
            (4, "mystery", Other, 0),
        ]
    );
}

/// A CUDA device is no use without what compiles its kernels: with `kind = "auto"` a run
/// then goes to the CPU and a warning says what is missing and how to add it; with
/// `kind = "cuda"` the recipe is refused before anything is written. Each of the three
/// things CubeCL needs (NVRTC, a toolkit's headers, a driver at least as new as NVRTC) is
/// named on its own; all present, the run's device reason says what was found.
#[test]
fn a_cuda_device_without_a_kernel_compiler_runs_on_the_cpu_or_is_refused() {
    use runner::plan::{CudaToolchain, Device};
    std::env::set_current_dir(root()).unwrap();
    let full = CudaToolchain {
        driver: Some((12, 4)),
        nvrtc: Ok(("libnvrtc.so.12".into(), (12, 4))),
        toolkit: Some("/usr/local/cuda".into()),
    };
    let with = |t: CudaToolchain| Machine {
        cuda_toolchain: Some(t),
        ..any_machine()
    };
    let check_with = |kind: &str, m: &Machine| {
        let sets = [format!("backend.kind=\"{kind}\"")];
        runner::sweep::check(Path::new("recipes/quickstart.toml"), &sets, m, 16)
            .map(|c| c.plans.into_iter().next().unwrap())
    };

    let p = check_with("auto", &with(full.clone())).expect("all there");
    assert_eq!(p.device, Device::Cuda(0));
    assert!(
        p.device_reason
            .contains("driver CUDA 12.4, NVRTC 12.4 (libnvrtc.so.12), toolkit /usr/local/cuda"),
        "{}",
        p.device_reason
    );
    // A newer driver loads an older NVRTC's kernels.
    let newer_driver = CudaToolchain {
        driver: Some((13, 0)),
        ..full.clone()
    };
    assert_eq!(
        check_with("cuda", &with(newer_driver)).unwrap().device,
        Device::Cuda(0)
    );

    let missing = [
        (
            CudaToolchain {
                nvrtc: Err("none of libnvrtc.so, libnvrtc.so.12 is on the library path".into()),
                ..full.clone()
            },
            [
                "NVRTC",
                "cannot be loaded",
                "libnvrtc.so.12 is on the library path",
                "LD_LIBRARY_PATH",
            ],
        ),
        (
            CudaToolchain {
                toolkit: None,
                ..full.clone()
            },
            [
                "no CUDA toolkit found",
                "/usr/local/cuda",
                "$CUDA_PATH",
                "set CUDA_PATH",
            ],
        ),
        (
            CudaToolchain {
                nvrtc: Ok(("libnvrtc.so.12".into(), (12, 8))),
                ..full.clone()
            },
            [
                "CUDA 12.8's",
                "newer than the CUDA 12.4",
                "update the NVIDIA driver",
                "12.4 or older",
            ],
        ),
    ];
    for (t, words) in missing {
        let p = check_with("auto", &with(t.clone())).expect("auto falls back");
        assert_eq!(p.device, Device::Cpu, "{t:?}");
        assert!(p.device_reason.contains(words[0]), "{}", p.device_reason);
        let warnings: Vec<String> = p.warnings.iter().map(|w| w.to_string()).collect();
        assert!(
            warnings.iter().any(|w| w.contains("backend.kind")
                && w.contains("running on the CPU")
                && words.iter().all(|x| w.contains(x))),
            "{warnings:?}"
        );
        let e = check_with("cuda", &with(t)).unwrap_err().to_string();
        assert!(
            e.contains("backend.kind")
                && e.contains("CUDA was asked for, but")
                && words.iter().all(|x| e.contains(x))
                && e.contains("or set kind = \"auto\" or \"cpu\""),
            "{e}"
        );
    }
}

/// `backend.fusion = "auto"` (the default) decides by the CPUs the process may use: fusion
/// from 4 (the training loop, fusion and CubeCL's device thread each spin on a core while
/// they wait), none below, and says why. An explicit `true` is kept and warned about below
/// 4 CPUs, and 1 CPU is warned about on any CubeCL backend; the CPU backend says nothing.
/// A recipe that says nothing of fusion validates (no machine) with fusion on.
#[test]
fn fusion_auto_follows_the_cpus_this_process_may_use() {
    use runner::plan::Device;
    std::env::set_current_dir(root()).unwrap();
    let check_with = |sets: &[&str], cpus: Option<usize>| {
        let m = Machine {
            cpus,
            ..any_machine()
        };
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let p = runner::sweep::check(Path::new("recipes/quickstart.toml"), &sets, &m, 16)
            .map(|c| c.plans.into_iter().next().unwrap())
            .expect("valid");
        let warnings: Vec<String> = p.warnings.iter().map(|w| w.to_string()).collect();
        (p, warnings)
    };
    let cuda = "backend.kind=\"cuda\"";
    for (cpus, on, why) in [
        (
            Some(16),
            true,
            "auto: 16 CPUs for this process, fusion from 4",
        ),
        (
            Some(4),
            true,
            "auto: 4 CPUs for this process, fusion from 4",
        ),
        (
            Some(3),
            false,
            "auto: 3 CPUs for this process, fusion from 4",
        ),
        (
            Some(2),
            false,
            "auto: 2 CPUs for this process, fusion from 4",
        ),
        (None, true, "auto: the CPUs were not looked at"),
    ] {
        let (p, warnings) = check_with(&[cuda], cpus);
        assert_eq!(p.device, Device::Cuda(0));
        assert_eq!(p.kernels.fusion, on, "{cpus:?}");
        assert!(
            p.kernels.fusion_reason.starts_with(why),
            "{cpus:?}: {}",
            p.kernels.fusion_reason
        );
        assert!(warnings.is_empty(), "{cpus:?}: {warnings:?}");
    }
    let label =
        runner::backend::describe(Device::Cuda(0), &check_with(&[cuda], Some(2)).0.kernels).0;
    assert!(
        label.starts_with("cuda (no fusion: 2 CPUs, autotune balanced"),
        "{label}"
    );
    let label =
        runner::backend::describe(Device::Cuda(0), &check_with(&[cuda], Some(8)).0.kernels).0;
    assert!(
        label.starts_with("cuda (fusion, autotune balanced"),
        "{label}"
    );

    // Asked for: kept either way; with fusion on 2 CPUs, a warning naming the key.
    let (p, warnings) = check_with(&[cuda, "backend.fusion=true"], Some(2));
    assert!(p.kernels.fusion);
    assert!(
        warnings.len() == 1
            && warnings[0].contains("backend.fusion")
            && warnings[0].contains("fusion with 2 CPUs for this process")
            && warnings[0].contains("give the process at least 4 CPUs"),
        "{warnings:?}"
    );
    let (p, warnings) = check_with(&[cuda, "backend.fusion=false"], Some(16));
    assert!(!p.kernels.fusion && p.kernels.fusion_reason == "backend.fusion = false");
    assert!(warnings.is_empty(), "{warnings:?}");
    let (p, warnings) = check_with(&[cuda, "backend.fusion=true"], Some(16));
    assert!(p.kernels.fusion && warnings.is_empty(), "{warnings:?}");

    // 1 CPU: the device thread and the loop take turns, fusion or not.
    let (p, warnings) = check_with(&[cuda, "backend.fusion=false"], Some(1));
    assert!(!p.kernels.fusion);
    assert!(
        warnings.len() == 1
            && warnings[0].contains("backend.kind")
            && warnings[0].contains("this process may use 1 CPU")
            && warnings[0].contains("give the process at least 2 CPUs"),
        "{warnings:?}"
    );
    // The CPU backend has no such threads: fusion does nothing there at all, said so.
    let (_, warnings) = check_with(&["backend.kind=\"cpu\"", "backend.fusion=true"], Some(1));
    assert!(
        warnings.len() == 1 && warnings[0].contains("backend.fusion: does nothing here"),
        "{warnings:?}"
    );

    // Anything else is refused with the values it takes.
    let sets = ["backend.fusion=\"yes\"".to_string()];
    let Err(e) = runner::sweep::check(
        Path::new("recipes/quickstart.toml"),
        &sets,
        &any_machine(),
        16,
    ) else {
        panic!("backend.fusion = \"yes\" was taken");
    };
    let e = e.to_string();
    assert!(
        e.contains("backend.fusion") && e.contains("true, false or \"auto\""),
        "{e}"
    );
}
