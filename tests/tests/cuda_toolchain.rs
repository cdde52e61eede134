//! A CUDA binary on a machine whose driver answers but which cannot compile kernels, seen
//! through the binary: a fake `libcuda.so.1` (one "Fake GPU", the driver version from
//! `FAKE_CUDA_DRIVER`) and a fake `libnvrtc.so.12` (its version from `FAKE_NVRTC`), built
//! here with the C compiler. CUDA builds only; nothing here starts CubeCL, which would call
//! the fake driver for real.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{expect_exit, runner_cmd, tempdir, tiny_recipe};

const FAKE_CUDA: &str = r#"
#include <stdlib.h>
#include <string.h>
int cuInit(unsigned f) { return 0; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int i) { *d = i; return 0; }
int cuDeviceGetName(char *s, int len, int d) { strncpy(s, "Fake GPU", len); return 0; }
int cuDeviceTotalMem_v2(size_t *b, int d) { *b = (size_t)80 << 30; return 0; }
int cuDriverGetVersion(int *v) { const char *e = getenv("FAKE_CUDA_DRIVER"); *v = e ? atoi(e) : 12040; return 0; }
"#;

const FAKE_NVRTC: &str = r#"
#include <stdlib.h>
#include <stdio.h>
int nvrtcVersion(int *major, int *minor) {
    const char *e = getenv("FAKE_NVRTC");
    *major = 12; *minor = 4;
    if (e) sscanf(e, "%d.%d", major, minor);
    return 0;
}
"#;

/// Compiles `source` into `dir/name` as a shared library.
fn shared_library(dir: &Path, name: &str, source: &str) {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).unwrap();
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join(name))
        .arg(&c)
        .output()
        .expect("a C compiler (cc) builds the fake CUDA libraries");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `driver/` holds the fake libcuda alone, `both/` it and the fake NVRTC; `toolkit/` is a
/// CUDA_PATH with an include/.
fn fakes(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (driver, both, toolkit) = (dir.join("driver"), dir.join("both"), dir.join("toolkit"));
    for d in [&driver, &both, &toolkit.join("include")] {
        std::fs::create_dir_all(d).unwrap();
    }
    shared_library(&driver, "libcuda.so.1", FAKE_CUDA);
    shared_library(&both, "libcuda.so.1", FAKE_CUDA);
    shared_library(&both, "libnvrtc.so.12", FAKE_NVRTC);
    (driver, both, toolkit)
}

fn runner_with(libs: &Path, toolkit: &Path, env: &[(&str, &str)]) -> Command {
    let mut c = runner_cmd();
    c.env("LD_LIBRARY_PATH", libs).env("CUDA_PATH", toolkit);
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

#[test]
fn a_gpu_without_nvrtc_or_with_one_newer_than_its_driver_is_said_before_anything_runs() {
    let dir = tempdir("cuda-toolchain");
    let (driver, both, toolkit) = fakes(&dir);
    let text = |o: &std::process::Output| {
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
    };

    // `runner ls`: the device, and what its kernels would be compiled with.
    let out = runner_with(&both, &toolkit, &[])
        .arg("ls")
        .output()
        .unwrap();
    expect_exit(&out, 0);
    let listed = text(&out);
    let want = format!(
        "kernels: driver CUDA 12.4, NVRTC 12.4 (libnvrtc.so.12), toolkit {}",
        toolkit.display()
    );
    assert!(
        listed.contains("0: Fake GPU, 80.0 GiB") && listed.contains(&want),
        "{listed}"
    );
    assert!(!listed.contains("cannot run"), "{listed}");
    let out = runner_with(&driver, &toolkit, &[])
        .arg("ls")
        .output()
        .unwrap();
    let listed = text(&out);
    assert!(
        listed.contains("no NVRTC") && listed.contains("cannot run: NVRTC"),
        "{listed}"
    );

    // kind = "cuda" without NVRTC: refused, exit 2, nothing written.
    let recipe = tiny_recipe(&dir, "tiny", "");
    let out = runner_with(&driver, &toolkit, &[])
        .arg(&recipe)
        .args(["--set", "backend.kind=\"cuda\"", "-q"])
        .output()
        .unwrap();
    expect_exit(&out, 2);
    let said = text(&out);
    assert!(
        said.contains("backend.kind")
            && said.contains("CUDA was asked for, but NVRTC")
            && said.contains("libnvrtc.so.12")
            && said.contains("LD_LIBRARY_PATH"),
        "{said}"
    );
    assert!(!dir.join("runs").exists(), "a refused recipe wrote a run");

    // NVRTC newer than the driver: kind = "cuda" refused, kind = "auto" runs on the CPU
    // and says why, in the warning and in env.json.
    let newer = [("FAKE_NVRTC", "12.8")];
    let out = runner_with(&both, &toolkit, &newer)
        .arg(&recipe)
        .args(["--set", "backend.kind=\"cuda\"", "-q"])
        .output()
        .unwrap();
    expect_exit(&out, 2);
    assert!(
        text(&out).contains("NVRTC (libnvrtc.so.12) is CUDA 12.8's, newer than the CUDA 12.4"),
        "{}",
        text(&out)
    );
    assert!(!dir.join("runs").exists(), "a refused recipe wrote a run");
    let out = runner_with(&both, &toolkit, &newer)
        .arg(&recipe)
        .args(["--set", "run.max_steps=2", "-q"])
        .output()
        .unwrap();
    expect_exit(&out, 0);
    assert!(
        text(&out).contains("CUDA device 0 found, but NVRTC")
            && text(&out).contains("running on the CPU"),
        "{}",
        text(&out)
    );
    let runs = dir.join("runs").join("tiny");
    let run = crate::common::only_run(&runs);
    let env = crate::common::json(&run.join("env.json"));
    let env = env.to_string();
    assert!(
        env.contains("flex (cpu)")
            && env.contains("newer than the CUDA 12.4")
            && env.contains("using the CPU"),
        "{env}"
    );
}
