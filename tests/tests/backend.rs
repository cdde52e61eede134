//! Which device a recipe's backend gets: WebGPU adapters as CubeCL counts them.

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
