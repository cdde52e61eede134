//! `env.json`: what a colleague needs to reproduce a run (versions, backend and device,
//! machine, command line, the recipe files with their hashes and git state, kernel cache).

use super::*;

/// `env.json`: what a colleague needs to know to reproduce the run.
#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    pub runner_version: String,
    pub burn_version: String,
    pub backend: String,
    pub device: String,
    pub device_reason: String,
    pub threads: usize,
    pub cpus: usize,
    pub os: String,
    pub arch: String,
    pub hostname: Option<String>,
    pub command: Vec<String>,
    /// The working directory the command ran in: its relative paths (the recipe, `--set`
    /// paths, `log.dir`) are relative to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    pub recipe: String,
    /// Every file that made the recipe (it, then what it extends), each with its hash and
    /// git state, so a colleague can check out the same recipe.
    pub sources: Vec<SourceInfo>,
    /// `--set` overrides, as given.
    pub overrides: Vec<String>,
    pub started_at: String,
    /// Where CUDA kernels and autotune results are cached and how they are tuned; with
    /// what the run compiled, loaded from the cache and tuned (hits and misses), filled in
    /// when the run ends.
    pub kernels: crate::kernels::KernelSettings,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_counts: Option<crate::kernels::KernelCounts>,
    /// The data files as the run read them (size and CRC-32): `runner resume` continues
    /// only on the same data.
    pub data: Vec<DataFile>,
    /// The grid cell the run is, where a grid ran it: `--resume` takes a cell's status
    /// naming this run as that cell's only where it is this one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cell: Option<crate::sweep::GridCell>,
}

/// One `runner resume` of the run (or a grid's `--resume` of its cell), in env.json's
/// `resumes`: the fields above are the first process's, and a resume may run on another
/// machine, device, thread count or runner version.
#[derive(Debug, Clone, Serialize)]
pub struct Resumed {
    pub started_at: String,
    /// The checkpoint's step: the steps after it are this process's.
    pub from_step: u64,
    pub runner_version: String,
    pub backend: String,
    pub device: String,
    pub threads: usize,
    /// The CPUs this process could use (as the run's `cpus`): a resume under `taskset`
    /// or a smaller Slurm task runs its steps on fewer.
    pub cpus: usize,
    pub hostname: Option<String>,
    pub command: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// On CUDA and WebGPU, what this process compiled and tuned (filled in at its end).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_counts: Option<crate::kernels::KernelCounts>,
}

impl Resumed {
    pub fn of(env: &Environment, from_step: u64) -> Resumed {
        Resumed {
            started_at: env.started_at.clone(),
            from_step,
            runner_version: env.runner_version.clone(),
            backend: env.backend.clone(),
            device: env.device.clone(),
            threads: env.threads,
            cpus: env.cpus,
            hostname: env.hostname.clone(),
            command: env.command.clone(),
            cwd: env.cwd.clone(),
            kernel_counts: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct DataFile {
    pub path: String,
    pub bytes: u64,
    pub crc32: String,
}

/// How the data files `plan` reads differ by content from those the run in `run_dir`
/// trained on (its env.json's `data`), in words; `None` where they are the same, or where
/// env.json does not say. Paths do not count: the same files elsewhere are the same data.
pub fn other_data(run_dir: &Path, plan: &Plan) -> Option<String> {
    let env: serde_json::Value =
        serde_json::from_str(&crate::metrics::read_text(run_dir.join("env.json")).ok()?).ok()?;
    let then: Vec<DataFile> = serde_json::from_value(env.get("data")?.clone()).ok()?;
    let now = data_files(plan);
    let key = |f: &DataFile| (f.bytes, f.crc32.clone());
    let (mut a, mut b): (Vec<_>, Vec<_>) = (
        then.iter().map(key).collect(),
        now.iter().map(key).collect(),
    );
    a.sort();
    b.sort();
    if a == b {
        return None;
    }
    let gone = then.iter().find(|f| !b.contains(&key(f)));
    let new = now.iter().find(|f| !a.contains(&key(f)));
    Some(match (gone, new) {
        (_, Some(n)) => format!(
            "{} is {} bytes, CRC-32 {}, which it did not train on",
            n.path, n.bytes, n.crc32
        ),
        (Some(g), None) => format!("it trained on {}, which this recipe does not read", g.path),
        (None, None) => "its data files differ".into(),
    })
}

/// Each data file of the plan with its size and CRC-32 (one that cannot be read has
/// none: it was read moments ago, and the run says so if it is gone). The sum is the one
/// taken as the checks or the load last read the file whole, what the run trained on even
/// if the file changed since; only a file they did not read whole (past `data.limit`) is
/// read again.
pub fn data_files(plan: &Plan) -> Vec<DataFile> {
    plan.data
        .files()
        .iter()
        .filter_map(|p| {
            let sum =
                crate::data::sums::loaded(p).or_else(|| crate::data::sums::file_sum(p).ok())?;
            // The same file however the recipe was named (`recipes/../x.bin` from the
            // command line, an absolute path in the run's own recipe.toml).
            let path = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            Some(DataFile {
                path: path.display().to_string(),
                bytes: sum.bytes,
                crc32: sum.crc32,
            })
        })
        .collect()
}

#[derive(Debug, Clone, Serialize)]
pub struct SourceInfo {
    pub path: String,
    pub sha256: String,
    pub git: Option<GitInfo>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GitInfo {
    /// HEAD of the repository holding the file.
    pub commit: String,
    /// The file differs from that commit, or is not tracked (ignored files included).
    pub dirty: bool,
    /// When dirty: `git diff HEAD` of the file, as `git apply` takes it (its whole text
    /// when untracked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
}

/// The commit of the git repository holding `file`, if any, and whether the file differs.
pub fn git_info(file: &Path) -> Option<GitInfo> {
    // A recipe that is a symbolic link (to a team's repository) is its target's, as its
    // paths are: the link's folder, outside any repository, recorded no commit.
    let real = std::fs::canonicalize(file).ok();
    let file = real.as_deref().unwrap_or(file);
    let dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // `git status` refreshes the index under `.git/index.lock` unless told not to: a
    // `git add` of the user's at that moment failed ("index.lock: File exists"), and a
    // run killed then (scancel, the OOM killer) left the lock to break the repository.
    // The repository is the one holding the file: a GIT_DIR or GIT_WORK_TREE of the
    // caller's named another (its commit was recorded for this recipe).
    let git_raw = |args: &[&str]| {
        std::process::Command::new("git")
            .env("GIT_OPTIONAL_LOCKS", "0")
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .env_remove("GIT_INDEX_FILE")
            .arg("--no-optional-locks")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let git = |args: &[&str]| git_raw(args).map(|s| s.trim().to_string());
    let commit = git(&["rev-parse", "HEAD"])?;
    let name = file.file_name()?.to_str()?;
    // `--ignored`: a recipe in an ignored folder (a run's own recipe.toml under runs/) is
    // not in the commit, and `git status` alone listed it as clean.
    let status = git(&["status", "--porcelain", "--ignored", "--", name]).unwrap_or_default();
    let dirty = !status.is_empty();
    let diff = dirty.then(|| {
        if status.starts_with("??") || status.starts_with("!!") {
            crate::metrics::read_text(file).unwrap_or_default()
        } else {
            // Whole, with its last newline (trimmed, `git apply` called it corrupt), and
            // in git's own form whatever the user's config says (colour, no prefixes, an
            // external diff tool made a patch `git apply` refuses).
            git_raw(&[
                "-c",
                "color.ui=never",
                "diff",
                "--no-color",
                "--no-ext-diff",
                "--no-textconv",
                "--src-prefix=a/",
                "--dst-prefix=b/",
                "HEAD",
                "--",
                name,
            ])
            .unwrap_or_default()
        }
    });
    Some(GitInfo {
        commit,
        dirty,
        diff,
    })
}

pub(crate) fn sha256_file(path: &Path) -> String {
    std::fs::read(path)
        .map(|b| sha256_bytes(&b))
        .unwrap_or_default()
}

pub(crate) fn sha256_bytes(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

pub(crate) fn environment(plan: &Plan, p: &Prepared) -> Environment {
    Environment {
        runner_version: env!("CARGO_PKG_VERSION").into(),
        burn_version: BURN_VERSION.into(),
        backend: p.backend_name.clone(),
        device: p.device_name.clone(),
        device_reason: plan.device_reason.clone(),
        threads: p.threads,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        os: std::env::consts::OS.into(),
        arch: std::env::consts::ARCH.into(),
        hostname: crate::clock::hostname(),
        command: std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        cwd: std::env::current_dir()
            .ok()
            .map(|d| d.display().to_string()),
        // Absolute, as every path here, whatever the working directory.
        recipe: absolute(&plan.recipe_path).display().to_string(),
        sources: plan
            .sources
            .iter()
            .map(|p| SourceInfo {
                path: absolute(p).display().to_string(),
                sha256: sha256_file(p),
                git: git_info(p),
            })
            .collect(),
        overrides: plan.overrides.clone(),
        started_at: utc_now(),
        kernels: p.settings.clone(),
        kernel_counts: None,
        data: data_files(plan),
        cell: None,
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}
