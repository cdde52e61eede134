//! What the tests share: paths, temporary directories, the binary, reading what a run wrote.

use std::path::{Path, PathBuf};
use std::process::Command;

use runner::metrics::{StepRecord, Summary};
use runner::plan::{self, Machine, Plan};
use runner::recipe::{self, Diagnostics};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// What the binary checks: the recipe, every cell of its grid (the first cell's plan).
pub fn check(path: &Path, machine: &Machine) -> Result<Plan, Diagnostics> {
    runner::sweep::check(path, &[], machine, runner::sweep::DEFAULT_MAX_CELLS)
        .map(|c| c.plans.into_iter().next().expect("a recipe has a cell"))
}

pub fn any_machine() -> Machine {
    Machine {
        cuda_compiled: true,
        cuda_devices: Ok(8),
        host_memory: None,
        gpu_memory: vec![],
        wgpu_compiled: true,
        wgpu_adapters: None,
        cuda_toolchain: None,
        cpus: None,
    }
}

pub fn expect(path: &Path, actual: &str) {
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(path, actual).unwrap();
        return;
    }
    let want =
        std::fs::read_to_string(path).unwrap_or_else(|_| panic!("missing {}", path.display()));
    assert_eq!(
        actual,
        want,
        "{} differs (UPDATE_EXPECT=1 rewrites it)",
        path.display()
    );
}

// ---------------------------------------------------------------- real runs

/// A fresh directory for one test, named by the test and this process. The first call
/// also removes what earlier test processes left (their pid is no longer running), so
/// repeated test runs do not fill the temporary directory.
pub fn tempdir(tag: &str) -> PathBuf {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(remove_stale_test_dirs);
    let d = std::env::temp_dir().join(format!("runner-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `runner-test-*-PID` of processes gone (the library's unit tests remove their own
/// scratch directories as they end: `src/scratch.rs`).
pub fn remove_stale_test_dirs() {
    // Whether a pid runs is read from /proc; without it (not Linux) nothing is removed.
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = name.starts_with("runner-test-");
        let pid = name.rsplit('-').next().and_then(|p| p.parse::<u32>().ok());
        if let (true, Some(pid)) = (ours, pid) {
            let gone = !Path::new(&format!("/proc/{pid}")).exists();
            if gone && pid != std::process::id() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// A plan from recipe text placed in `tests/fixtures/` (so shipped-data paths resolve),
/// logging under a fresh temporary directory.
pub fn plan_from(tag: &str, body: &str) -> Plan {
    let logs = tempdir(tag);
    let log = format!("[log]\ndir = \"{}\"\nprogress = false\n", logs.display());
    let src = if body.contains("[log]\n") {
        body.replace("[log]\n", &log)
    } else {
        format!("{body}\n{log}")
    };
    let path = root().join(format!("tests/fixtures/{tag}.toml"));
    let l = recipe::parse(&path, src).unwrap_or_else(|r| panic!("{r}"));
    plan::validate(&l, &Machine::cpu_only()).unwrap_or_else(|r| panic!("{r}"))
}

pub fn records(dir: &Path) -> Vec<StepRecord> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad metrics line {l}: {e}")))
        .collect()
}

pub fn summary(dir: &Path) -> Summary {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

// ---------------------------------------------------------------- the binary

/// Runs `runner` with `args`, then `--set log.dir=<logs>`, then `extra`.
pub fn runner_logged(logs: &Path, args: &[&str], extra: &[&str]) -> std::process::Output {
    runner_cmd()
        .args(args)
        .arg("--set")
        .arg(format!("log.dir=\"{}\"", logs.display()))
        .args(extra)
        .output()
        .unwrap()
}

/// Runs `runner args` and asserts it exits 2 (bad input) with `want` on stderr.
pub fn refuses(args: &[&str], want: &str) {
    let out = runner_cmd().args(args).output().unwrap();
    expect_exit(&out, 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(want),
        "`runner {}`: {stderr}",
        args.join(" ")
    );
}

/// Asserts `runner`'s exit code, showing what it printed when the code differs.
pub fn expect_exit(out: &std::process::Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The one run directory under `dir`.
pub fn only_run(dir: &Path) -> PathBuf {
    let runs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs.into_iter().next().unwrap()
}

/// `runner GRID -q --resume`, its output.
pub fn resume_grid_quietly(grid: &Path) -> std::process::Output {
    runner_cmd()
        .arg(grid)
        .args(["-q", "--resume"])
        .output()
        .unwrap()
}

/// `runner resume RUN -q`, its output.
pub fn resume_quietly(run: &Path) -> std::process::Output {
    runner_cmd()
        .arg("resume")
        .arg(run)
        .arg("-q")
        .output()
        .unwrap()
}

/// `runner COMMAND RECIPE --set S...`, run to its end.
pub fn with_sets(command: &str, recipe: &Path, sets: &[&str]) -> std::process::Output {
    let mut c = runner_cmd();
    c.arg(command).arg(recipe);
    for s in sets {
        c.args(["--set", s]);
    }
    c.output().unwrap()
}

pub fn runner_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_runner"));
    c.current_dir(root());
    // The runner leaves SIGHUP ignored where it was started so (`nohup`): a suite run
    // under nohup would then see a SIGHUP test run on for ever.
    // SAFETY: `signal` is async-signal-safe, as `pre_exec` requires.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut c, || {
            libc::signal(libc::SIGHUP, libc::SIG_DFL);
            Ok(())
        });
    }
    c
}

pub fn statuses(dir: &Path) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(dir.join("cells"))
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let s: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                s["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

// ---------------------------------------------------------------- start-up, kernel cache, warm-up

/// A synthetic-data recipe in `dir` (100 training samples, 50 test samples, batch 32).
pub fn tiny_recipe(dir: &Path, name: &str, extra: &str) -> PathBuf {
    let recipe = dir.join(format!("{name}.toml"));
    std::fs::write(
        &recipe,
        format!("name = \"{name}\"\n[backend]\nkind = \"auto\"\n[model]\narch = \"mlp\"\n[data]\nformat = \"synthetic\"\nsynthetic = {{ samples = 100, test_samples = 50 }}\n[loader]\nbatch_size = 32\n[run]\nepochs = 1\nwarmup_steps = 1\neval = \"end\"\n[log]\ndir = \"{}\"\n{extra}", dir.join("runs").display()),
    )
    .unwrap();
    recipe
}

pub fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

// ---------------------------------------------------------------- when things go wrong

/// Every line of a metrics file parses (none was cut).
pub fn whole_lines(run: &Path) -> Vec<StepRecord> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert!(text.is_empty() || text.ends_with('\n'), "a cut last line");
    records(run)
}

pub fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

pub fn my_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").unwrap().uid()
}

pub fn is_root() -> bool {
    my_uid() == 0
}

/// `chown -R` (as root) or `chmod -R` (otherwise) so that `path` is, or is not, writable by
/// the user `as_other` runs commands as (`nobody` under root, else this user).
pub fn writable_by_other(path: &Path, yes: bool, recursive: bool) {
    let mut cmd = if is_root() {
        let mut c = Command::new("chown");
        c.arg(if yes { "65534" } else { "0" });
        c
    } else {
        let mut c = Command::new("chmod");
        c.arg(if yes { "u+w" } else { "a-w" });
        c
    };
    if recursive {
        cmd.arg("-R");
    }
    assert!(cmd.arg(path).status().unwrap().success());
}

/// The runner binary run as another user where the suite runs as root (`nobody`, through
/// util-linux's `setpriv`, from a copy of the binary under `dir` that user can reach), else
/// as this user.
pub fn as_other(dir: &Path) -> Command {
    let bin = dir.join("runner-bin");
    if !bin.exists() {
        std::fs::copy(env!("CARGO_BIN_EXE_runner"), &bin).unwrap();
    }
    let home = dir.join("other-home");
    std::fs::create_dir_all(&home).unwrap();
    if is_root() {
        std::os::unix::fs::chown(&home, Some(65534), Some(65534)).unwrap();
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&bin)
            .env("HOME", &home);
        c
    } else {
        let mut c = Command::new(&bin);
        c.env("HOME", &home);
        c
    }
}

// ---------------------------------------------------------------- long runs

/// A two-step MLP recipe `name.toml` in `dir` over Fashion-MNIST's test file, one side
/// (`data.<local>`: "train" or "test") read from a copy in `dir` that a test may change,
/// the other from the shipped file; `extra` appended. Returns the recipe and the copy.
pub fn mlp_over_a_copy(dir: &Path, name: &str, local: &str, extra: &str) -> (PathBuf, PathBuf) {
    let shipped = root().join("datasets/fashion_mnist/test_batch.bin");
    let copy = dir.join(format!("{local}.bin"));
    std::fs::copy(&shipped, &copy).unwrap();
    let other = if local == "train" { "test" } else { "train" };
    let recipe = dir.join(format!("{name}.toml"));
    std::fs::write(
        &recipe,
        format!(
            "name = \"{name}\"\n[model]\narch = \"mlp\"\nhidden = [16]\n[data]\nformat = \"cifar10-bin\"\n{local} = \"{local}.bin\"\n{other} = {:?}\n[run]\nmax_steps = 2\nwarmup_steps = 0\n[log]\ndir = {:?}\n{extra}",
            shipped.display().to_string(),
            dir.join("runs").display().to_string()
        ),
    )
    .unwrap();
    (recipe, copy)
}

/// The `eval-<time>.json` reports `runner eval` wrote in a run directory.
pub fn eval_reports(run: &Path) -> Vec<PathBuf> {
    walk_files(run)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("eval-")
        })
        .collect()
}

/// Cuts a file of CIFAR-10 records (3,073 bytes each) to its first `n`.
pub fn cut_records(path: &Path, n: usize) {
    let bytes = std::fs::read(path).unwrap();
    std::fs::write(path, &bytes[..3073 * n]).unwrap();
}

/// A Fashion-MNIST recipe long enough to interrupt (80 optimizer steps, ~2 s).
pub fn long_recipe(dir: &Path, name: &str, extra: &str) -> PathBuf {
    let recipe = dir.join(format!("{name}.toml"));
    let data = root().join("datasets/fashion_mnist");
    std::fs::write(
        &recipe,
        format!(
            "name = \"{name}\"\nseed = 5\n[model]\narch = \"small_cnn\"\nwidth = 8\n[data]\nformat = \"cifar10-bin\"\ntrain = \"{}\"\ntest = \"{}\"\nlimit = 640\naugment = {{ crop_padding = 2, hflip = true }}\n[loader]\nbatch_size = 32\n[optim]\nlr = 0.05\nmomentum = 0.9\nschedule = \"cosine\"\naccumulation_steps = 2\n[run]\nepochs = 8\nwarmup_steps = 1\neval = \"epoch\"\n[log]\ndir = \"{}\"\n{extra}",
            data.join("data_batch.bin").display(),
            data.join("test_batch.bin").display(),
            dir.join("runs").display()
        ),
    )
    .unwrap();
    recipe
}

/// `cp -a from to`: a copy of a run (or a log directory) with its times and modes.
pub fn copy_dir(from: &Path, to: &Path) {
    let copied = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(
        copied.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}

/// Each step's loss, bit for bit, from a run's metrics.
pub fn losses(run: &Path) -> Vec<(u64, u64)> {
    records(run)
        .iter()
        .map(|r| (r.step, r.loss.to_bits()))
        .collect()
}

/// A decoded TensorBoard event: its step, scalars, and whether it is a `SessionLog START`.
#[derive(Debug, Default)]
pub struct TbEvent {
    pub step: u64,
    pub scalars: Vec<(String, f32)>,
    pub restart: bool,
}

pub fn read_varint(b: &[u8], i: &mut usize) -> u64 {
    let (mut v, mut shift) = (0u64, 0);
    loop {
        let byte = b[*i];
        *i += 1;
        v |= ((byte & 0x7f) as u64) << shift;
        if byte < 0x80 {
            return v;
        }
        shift += 7;
    }
}

/// Protocol-buffer fields of a message: (field number, wire type, payload).
pub fn pb_fields(b: &[u8]) -> Vec<(u64, u64, Vec<u8>)> {
    let mut out = vec![];
    let mut i = 0;
    while i < b.len() {
        let key = read_varint(b, &mut i);
        let (field, wire) = (key >> 3, key & 7);
        let payload = match wire {
            0 => read_varint(b, &mut i).to_le_bytes().to_vec(),
            1 => {
                i += 8;
                b[i - 8..i].to_vec()
            }
            2 => {
                let n = read_varint(b, &mut i) as usize;
                i += n;
                b[i - n..i].to_vec()
            }
            5 => {
                i += 4;
                b[i - 4..i].to_vec()
            }
            w => panic!("wire type {w}"),
        };
        out.push((field, wire, payload));
    }
    out
}

/// Every event of a TFRecord event file, checking both CRCs of each record.
pub fn read_events(path: &Path) -> Vec<TbEvent> {
    let bytes = std::fs::read(path).unwrap();
    let mut i = 0;
    let mut out = vec![];
    while i < bytes.len() {
        let len_bytes = &bytes[i..i + 8];
        let n = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
        let crc = u32::from_le_bytes(bytes[i + 8..i + 12].try_into().unwrap());
        assert_eq!(
            crc,
            runner::tensorboard::masked_crc(len_bytes),
            "length CRC"
        );
        let data = &bytes[i + 12..i + 12 + n];
        let crc = u32::from_le_bytes(bytes[i + 12 + n..i + 16 + n].try_into().unwrap());
        assert_eq!(crc, runner::tensorboard::masked_crc(data), "data CRC");
        i += 16 + n;
        let mut e = TbEvent::default();
        for (field, _, payload) in pb_fields(data) {
            match field {
                2 => e.step = u64::from_le_bytes(payload.try_into().unwrap()),
                5 => {
                    for (_, _, value) in pb_fields(&payload) {
                        let (mut tag, mut v) = (String::new(), 0f32);
                        for (f, _, p) in pb_fields(&value) {
                            match f {
                                1 => tag = String::from_utf8(p).unwrap(),
                                2 => v = f32::from_le_bytes(p.try_into().unwrap()),
                                _ => {}
                            }
                        }
                        e.scalars.push((tag, v));
                    }
                }
                // `session_log` (status START, the only one the runner writes).
                7 => e.restart = true,
                _ => {}
            }
        }
        out.push(e);
    }
    out
}

/// `train/loss` by step across a run's event files, as TensorBoard reads them: a
/// `SessionLog START` at step s drops what earlier files said at s and past it.
pub fn tb_losses(run: &Path) -> Vec<(u64, f32)> {
    let mut files: Vec<PathBuf> = walk_files(run)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("events.out.tfevents.")
        })
        .collect();
    files.sort();
    let mut out: Vec<(u64, f32)> = vec![];
    for f in files {
        for e in read_events(&f) {
            if e.restart {
                out.retain(|(s, _)| *s < e.step);
            }
            for (tag, v) in e.scalars {
                if tag == "train/loss" {
                    out.push((e.step, v));
                }
            }
        }
    }
    out
}

pub const FASHION: &str = r#"
seed = 3
[model]
arch = "small_cnn"
width = 16
[data]
format = "cifar10-bin"
train = "../../datasets/fashion_mnist/data_batch.bin"
test = "../../datasets/fashion_mnist/test_batch.bin"
normalize = { mean = [0.2193], std = [0.3330] }
"#;

/// Spawns `cmd` with its output piped and waits (180 s at most: CI's two cores run the
/// other tests beside it, and 60 s was once not enough) until a file under `dir` is
/// `ready`; returns the process and that file.
pub fn spawn_until(
    mut cmd: Command,
    dir: &Path,
    ready: impl Fn(&Path) -> bool,
) -> (std::process::Child, PathBuf) {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    loop {
        if let Some(p) = walk_files(dir).into_iter().find(|p| ready(p)) {
            return (child, p);
        }
        if std::time::Instant::now() > deadline || child.try_wait().is_ok_and(|s| s.is_some()) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "nothing ready under {}: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A `summary.json` that says its run is under way.
pub fn says_running(p: &Path) -> bool {
    p.ends_with("summary.json")
        && std::fs::read_to_string(p).is_ok_and(|t| t.contains("\"running\""))
}

/// A `metrics.jsonl` with a line in it.
pub fn has_a_line(p: &Path) -> bool {
    p.ends_with("metrics.jsonl") && std::fs::metadata(p).is_ok_and(|m| m.len() > 0)
}

/// Overrides that give a first step of seconds on the CPU (ResNet-50 at batch 32 on
/// 64-pixel images), for a signal to land inside it.
pub const SLOW_FIRST_STEP: [&str; 6] = [
    "--set",
    "model.arch=\"resnet50\"",
    "--set",
    "data.synthetic.image_size=64",
    "--set",
    "loader.batch_size=32",
];

/// Sends `signal` (`-INT`, `-TERM`, ...) to `child`.
pub fn send(signal: &str, child: &std::process::Child) {
    signal_pid(signal, child.id());
}

/// `kill -SIGNAL pid` from this process, with no `kill` process started: that took
/// milliseconds, tens of them on a loaded machine, while a run went on by steps.
pub fn signal_pid(signal: &str, pid: u32) {
    let sig = match signal {
        "-INT" => libc::SIGINT,
        "-TERM" => libc::SIGTERM,
        "-KILL" => libc::SIGKILL,
        "-HUP" => libc::SIGHUP,
        _ => panic!("no signal {signal} here"),
    };
    // SAFETY: `kill` takes plain integers; the pid is a child this test started.
    let sent = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(sent, 0, "kill {signal} {pid}");
}

/// `runner validate` of a grid over the quickstart, written as `g.toml` in `dir` with
/// `sweep` (its axes, a line each) under `[sweep]`: exit 2 expected, stderr returned.
pub fn invalid_quickstart_grid(dir: &Path, sweep: &str) -> String {
    let grid = dir.join("g.toml");
    std::fs::write(
        &grid,
        format!(
            "extends = \"{}\"\n[sweep]\n{sweep}\n",
            root().join("recipes/quickstart.toml").display()
        ),
    )
    .unwrap();
    let out = runner_cmd().arg("validate").arg(&grid).output().unwrap();
    expect_exit(&out, 2);
    String::from_utf8_lossy(&out.stderr).into_owned()
}
