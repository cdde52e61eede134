//! Checkpoints and weights on disk. A checkpoint is a directory
//! `checkpoints/step-<step>/` holding the model and the optimizer state as Burn records
//! (`model.bin`, `optimizer.bin`: Burn's `BinFileRecorder` at full precision, parameter ids
//! included, so the optimizer's momentum and moments meet their parameters again) and
//! `state.json` (where the run was). It is written under a temporary name and renamed
//! whole, so a crash mid-write never leaves a checkpoint that loads wrong; the latest
//! `keep` are kept. The trained weights are `model.safetensors` (burn-store), for other
//! tools and for `runner eval`.
//!
//! `state.json` also holds the size and CRC-32 of `model.bin` and `optimizer.bin`, so a
//! checkpoint cut short or changed on disk (a full disk, a bad copy, a file from another
//! run) is found before it is loaded, and `runner resume` takes the one before it.
//!
//! Nothing else is needed to continue exactly: the learning rate is a function of the
//! step, and the data order and augmentation of the seed, the epoch and the sample
//! (`loader`, `data`), so `state.json` says where to start and the rest follows.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::ops::TrainBackend;
use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{BinFileRecorder, FullPrecisionSettings, Recorder, RecorderError};
use serde::{Deserialize, Serialize};

use super::Optim;
use crate::model::Net;

/// Where the run was when the checkpoint was written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// Optimizer steps done.
    pub step: u64,
    /// The epoch in progress (0-based) and the micro-batches of it already consumed.
    pub epoch: usize,
    pub batch: usize,
    pub epochs_completed: usize,
    /// Lines of `metrics.jsonl` up to this step: a resumed run continues after them.
    pub metrics_lines: u64,
    /// The resolved recipe's SHA-256: a checkpoint resumes only the run that wrote it.
    pub recipe_sha256: String,
    /// `every 500 steps`, `epoch end`, `SIGTERM`...
    pub reason: String,
    pub written_at: String,
    /// The watched validation metric's best (step, value) so far, and evaluations since.
    #[serde(default)]
    pub best: Option<(u64, f64)>,
    #[serde(default)]
    pub since_best: u64,
    /// With `run.stop_on_divergence = false`: the first step whose loss diverged, so a
    /// resumed run's summary still says so (it said `null`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diverged_at_step: Option<u64>,
    /// `model.bin` and `optimizer.bin` as written (none in checkpoints of earlier versions,
    /// which are loaded unchecked). Filled in by `save`.
    #[serde(default)]
    pub files: BTreeMap<String, FileSum>,
    /// What the summary held when the checkpoint was written, for a resume after a process
    /// that died without writing its summary (kill -9, out of memory, a lost node): the
    /// test evaluations and validations so far (they are on no metrics line), and the
    /// checkpoints written before this one and their time. `None` in checkpoints of
    /// earlier versions.
    #[serde(default)]
    pub recorded: Option<Recorded>,
    /// The CRC-32 of this state as JSON without this field: a state edited by hand (its
    /// batch, its line count) resumed into other training without a word. `None` in
    /// checkpoints of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_crc32: Option<String>,
}

impl State {
    /// The checksum `state_crc32` holds.
    fn checksum(&self) -> String {
        let bare = State {
            state_crc32: None,
            ..self.clone()
        };
        let text = serde_json::to_string(&bare).unwrap_or_default();
        format!("{:08x}", crc32fast::hash(text.as_bytes()))
    }
}

/// See [`State::recorded`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recorded {
    pub evals: Vec<crate::metrics::EvalRecord>,
    pub validations: Vec<crate::metrics::EvalRecord>,
    pub checkpoints_before: usize,
    pub checkpoint_ms_before: f64,
    /// The run's start-up (`summary.json`'s `startup_s`, `first_step_ms`: its first
    /// process's): a process killed outright before its summary said them lost them, and a
    /// resume recorded its own, seconds on warm caches where the run's cold start took
    /// minutes. `None` in checkpoints of earlier versions (left out, so their checksums
    /// still hold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_step_ms: Option<f64>,
    /// Loader workers started so far, over all the run's processes (`summary.json`'s
    /// `loader_workers_started`, which a process killed outright did not add to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loader_workers_started: Option<usize>,
    /// The SHA-256 of `model-best.safetensors` as last saved before this checkpoint: the
    /// best weights of `State::best`, which a resume checks the file against (it took the
    /// file as it found it, so a damaged one was vouched for by the summary). `None` where
    /// none was saved by then, and in checkpoints of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_weights_sha256: Option<String>,
}

// A checkpoint file's size and CRC-32 when it was written: enough to find a file cut
// short or changed by accident (not to tell a forged one). The same sum env.json keeps
// of the data files.
pub use crate::data::sums::{file_sum, FileSum};

/// The files a checkpoint's state vouches for.
const FILES: [&str; 2] = ["model.bin", "optimizer.bin"];

/// Whether a checkpoint's files are those its `state.json` was written with, and the
/// state itself as written: `Err` says which differs and how.
pub fn verify(dir: &Path, state: &State) -> Result<(), String> {
    if state
        .state_crc32
        .as_ref()
        .is_some_and(|c| *c != state.checksum())
    {
        return Err("state.json was changed after it was written (its checksum differs)".into());
    }
    for (name, want) in &state.files {
        let path = dir.join(name);
        let bytes = std::fs::metadata(&path)
            .map_err(|e| format!("{name}: {e}"))?
            .len();
        if bytes != want.bytes {
            return Err(format!(
                "{name} has {bytes} bytes, {} when it was written (cut short or replaced)",
                want.bytes
            ));
        }
        let got = file_sum(&path).map_err(|e| format!("{name}: {e}"))?;
        if got.crc32 != want.crc32 {
            return Err(format!(
                "{name} is not the file that was written (its CRC-32 differs)"
            ));
        }
    }
    Ok(())
}

type Rec = BinFileRecorder<FullPrecisionSettings>;

/// Writes what `Rec` reads (Burn's record with its metadata, bincode's standard
/// configuration) straight to the file, summing the bytes on the way: an I/O error is
/// said as one ("No space left on device"), not as Burn's
/// `Unknown("Io { inner: Os { code: 28, .. } }")`.
#[derive(Debug, Default, Clone)]
struct Stream;

impl<B: burn::tensor::backend::Backend> Recorder<B> for Stream {
    type Settings = FullPrecisionSettings;
    type RecordArgs = PathBuf;
    type RecordOutput = FileSum;
    type LoadArgs = PathBuf;

    fn save_item<I: serde::Serialize>(
        &self,
        item: I,
        path: PathBuf,
    ) -> Result<FileSum, RecorderError> {
        let unknown = |e: std::io::Error| RecorderError::Unknown(e.to_string());
        let file = std::fs::File::create(&path).map_err(unknown)?;
        let mut out = Summed {
            inner: std::io::BufWriter::with_capacity(1 << 20, file),
            hash: crc32fast::Hasher::new(),
            bytes: 0,
            error: None,
        };
        if let Err(e) =
            bincode::serde::encode_into_std_write(&item, &mut out, bincode::config::standard())
        {
            return Err(match out.error.take() {
                Some(io) => unknown(io),
                None => RecorderError::Unknown(e.to_string()),
            });
        }
        use std::io::Write as _;
        out.inner.flush().map_err(unknown)?;
        Ok(FileSum {
            bytes: out.bytes,
            crc32: format!("{:08x}", out.hash.finalize()),
        })
    }

    fn load_item<I: serde::de::DeserializeOwned>(
        &self,
        path: &mut PathBuf,
    ) -> Result<I, RecorderError> {
        Recorder::<B>::load_item(&Rec::new(), path)
    }
}

/// A writer that sums what passes through it and keeps the first I/O error whole.
struct Summed<W> {
    inner: W,
    hash: crc32fast::Hasher,
    bytes: u64,
    error: Option<std::io::Error>,
}

impl<W: std::io::Write> std::io::Write for Summed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.inner.write(buf) {
            Ok(n) => {
                self.hash.update(&buf[..n]);
                self.bytes += n as u64;
                Ok(n)
            }
            Err(e) => {
                let kept = std::io::Error::new(e.kind(), e.to_string());
                self.error.get_or_insert(e);
                Err(kept)
            }
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A recorder's error in its own words.
fn words(e: RecorderError) -> String {
    match e {
        RecorderError::FileNotFound(s)
        | RecorderError::DeserializeError(s)
        | RecorderError::Unknown(s) => s,
    }
}

fn checkpoints(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

/// Writes a checkpoint (atomically: temporary directory, then rename), then [`prune`]s.
/// `written` is how many metrics lines are on disk now. Returns its directory.
pub fn save<B: TrainBackend>(
    run_dir: &Path,
    model: &Net<B>,
    optim: &Optim<B>,
    state: &State,
    (keep, written): (usize, u64),
) -> Result<PathBuf, String> {
    let root = checkpoints(run_dir);
    let name = format!("step-{:09}", state.step);
    let tmp = root.join(format!(".tmp-{name}-{}", std::process::id()));
    let saved = save_in(run_dir, &tmp, &name, model, optim, state);
    if saved.is_err() {
        // A half-written checkpoint (a full disk) is no use, and its space is needed.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    if saved.is_ok() {
        prune(run_dir, keep, written);
    }
    saved
}

/// Removes all checkpoints but the latest `keep`, and keeps also the latest one whose
/// metrics lines are all on disk (`written` lines now): a checkpoint inside a step is
/// written before its step's line, and with `keep = 1` a kill between the two left none
/// that a resume could use. So `keep + 1` are on disk until the next line is written, and
/// `keep` once the run ends. Also removes what no resume can use: temporary directories
/// of checkpoints cut short (a killed process's), and broken `step-*` directories older
/// than the latest whole one. A run's directory has one writer at a time (a run, or the
/// resume holding its `run.lock`), so none of these is being written.
pub fn prune(run_dir: &Path, keep: usize, written: u64) {
    let (all, broken) = scan(run_dir);
    let covered = all.iter().rposition(|(_, s)| s.metrics_lines <= written);
    for (i, (old, _)) in all.iter().enumerate() {
        if i + keep < all.len() && Some(i) != covered {
            let _ = std::fs::remove_dir_all(old);
        }
    }
    // `step-` and nine digits: names sort as their steps.
    let newest = all
        .last()
        .and_then(|(p, _)| p.file_name().map(|n| n.to_owned()));
    for (old, _) in broken {
        if let (Some(n), Some(o)) = (&newest, old.file_name()) {
            if o < n.as_os_str() {
                let _ = std::fs::remove_dir_all(&old);
            }
        }
    }
    let temporaries = std::fs::read_dir(checkpoints(run_dir))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(".tmp-step-"))
        });
    for t in temporaries {
        let _ = std::fs::remove_dir_all(t.path());
    }
}

fn save_in<B: TrainBackend>(
    run_dir: &Path,
    tmp: &Path,
    name: &str,
    model: &Net<B>,
    optim: &Optim<B>,
    state: &State,
) -> Result<PathBuf, String> {
    let io = |what: &str, e: &dyn std::fmt::Display| {
        format!("checkpoint {}: {what}: {e}", tmp.display())
    };
    let _ = std::fs::remove_dir_all(tmp);
    // Never `create_dir_all`: a run directory removed while the run ran must not come back
    // as a skeleton holding only checkpoints.
    match std::fs::create_dir(checkpoints(run_dir)) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(io("cannot create", &e));
        }
        _ => {}
    }
    std::fs::create_dir(tmp).map_err(|e| io("cannot create", &e))?;
    // One record at a time, streamed to its file: the encoded bytes are never held (they
    // were, both records' together, and a run that trained within `ulimit -v` aborted at
    // its first checkpoint).
    let mut state = state.clone();
    let model_sum = Recorder::<B>::record(&Stream, model.clone().into_record(), tmp.join(FILES[0]))
        .map_err(|e| io(FILES[0], &words(e)))?;
    state.files.insert(FILES[0].to_string(), model_sum);
    let optim_sum = match optim {
        Optim::Sgd(o) => Recorder::<B>::record(&Stream, o.to_record(), tmp.join(FILES[1])),
        Optim::AdamW(o) => Recorder::<B>::record(&Stream, o.to_record(), tmp.join(FILES[1])),
    }
    .map_err(|e| io(FILES[1], &words(e)))?;
    state.files.insert(FILES[1].to_string(), optim_sum);
    state.state_crc32 = None;
    state.state_crc32 = Some(state.checksum());
    let text = serde_json::to_string_pretty(&state).map_err(|e| io("state", &e))?;
    std::fs::write(tmp.join("state.json"), text + "\n").map_err(|e| io("state.json", &e))?;
    let dir = checkpoints(run_dir).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(tmp, &dir).map_err(|e| io("cannot rename", &e))?;
    Ok(dir)
}

/// Complete checkpoints of a run, oldest first (a temporary directory left by a crash is
/// not one).
pub fn list(run_dir: &Path) -> Vec<(PathBuf, State)> {
    scan(run_dir).0
}

/// A `step-*` directory that is not a whole checkpoint, and why.
pub type NotCheckpoint = (PathBuf, String);

/// The checkpoints of a run, oldest first, and the `step-*` directories that are not
/// whole ones (no or an unreadable `state.json`, a file missing).
pub fn scan(run_dir: &Path) -> (Vec<(PathBuf, State)>, Vec<NotCheckpoint>) {
    let (mut good, mut bad) = (vec![], vec![]);
    let dirs = std::fs::read_dir(checkpoints(run_dir))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("step-"))
        });
    for p in dirs {
        let state = crate::metrics::read_text(p.join("state.json"))
            .map_err(|e| format!("state.json: {e}"))
            .and_then(|s| {
                serde_json::from_str::<State>(&s)
                    .map_err(|e| format!("state.json:{}:{}: {e}", e.line(), e.column()))
            });
        let missing = FILES.iter().find(|f| !p.join(f).is_file());
        match (state, missing) {
            (Ok(state), None) => good.push((p, state)),
            (Err(why), _) => bad.push((p, why)),
            (_, Some(f)) => bad.push((p, format!("{f} is missing"))),
        }
    }
    good.sort_by_key(|(_, s)| s.step);
    bad.sort();
    (good, bad)
}

/// The latest complete checkpoint.
pub fn latest(run_dir: &Path) -> Option<(PathBuf, State)> {
    list(run_dir).pop()
}

/// Whether a checkpoint loads into the model and optimizer `plan` builds, tried on the
/// CPU: `runner resume` asks before it changes anything in the run directory. (Found only
/// when training loaded it, a checkpoint of another model layout left the run cut back to
/// it and marked failed.) `shape` is the batches' input shape.
pub fn fits(
    plan: &crate::plan::Plan,
    shape: crate::model::Shape,
    dir: &Path,
) -> Result<(), String> {
    type Cpu = crate::backend::CpuBackend;
    let device = crate::backend::cpu_device();
    let model = Net::<Cpu>::new(&plan.model, shape, plan.seed, &device);
    load::<Cpu>(dir, model, Optim::<Cpu>::new(&plan.optim), &device).map(|_| ())
}

/// Loads a checkpoint's model and optimizer state into freshly built ones.
pub fn load<B: TrainBackend>(
    dir: &Path,
    model: Net<B>,
    optim: Optim<B>,
    device: &B::Device,
) -> Result<(Net<B>, Optim<B>), String> {
    let rec = Rec::new();
    let err = |what: &str, e: &dyn std::fmt::Display| {
        format!("checkpoint {}: {what}: {e}", dir.display())
    };
    // Burn panics on a record that does not fit the model (another layout, a file changed
    // after it was checked): an error, not a crash.
    crate::clock::quietly(|| load_unchecked::<B>(dir, &rec, model, optim, device, &err)).map_err(
        |panics| {
            err(
                "does not fit this recipe's model",
                &panics.last().cloned().unwrap_or_default(),
            )
        },
    )?
}

fn load_unchecked<B: TrainBackend>(
    dir: &Path,
    rec: &Rec,
    model: Net<B>,
    optim: Optim<B>,
    device: &B::Device,
    err: &dyn Fn(&str, &dyn std::fmt::Display) -> String,
) -> Result<(Net<B>, Optim<B>), String> {
    let record =
        Recorder::<B>::load(rec, dir.join("model"), device).map_err(|e| err("model", &e))?;
    // Burn takes a record's tensors whatever their shapes (a layer of 16 for one of 256 is
    // loaded, and trains): compared here.
    let want = shapes(&model);
    let model = model.load_record(record).in_device_layouts();
    let got = shapes(&model);
    if let Some(i) = (0..want.len().max(got.len())).find(|&i| want.get(i) != got.get(i)) {
        return Err(err(
            "does not fit this recipe's model",
            &format!(
                "its tensor {} has shape {:?}, the model's {:?}",
                i + 1,
                got.get(i).cloned().unwrap_or_default(),
                want.get(i).cloned().unwrap_or_default()
            ),
        ));
    }
    let optim = match optim {
        Optim::Sgd(o) => Optim::Sgd(
            o.load_record(
                Recorder::<B>::load(rec, dir.join("optimizer"), device)
                    .map_err(|e| err("optimizer", &e))?,
            ),
        ),
        Optim::AdamW(o) => Optim::AdamW(
            o.load_record(
                Recorder::<B>::load(rec, dir.join("optimizer"), device)
                    .map_err(|e| err("optimizer", &e))?,
            ),
        ),
    };
    Ok((model, optim))
}

/// The shapes of a model's parameters, in the order Burn visits them.
fn shapes<B: crate::ops::ModelBackend>(model: &Net<B>) -> Vec<Vec<usize>> {
    struct Shapes(Vec<Vec<usize>>);
    impl<B: burn::tensor::backend::Backend> burn::module::ModuleVisitor<B> for Shapes {
        fn visit_float<const D: usize>(
            &mut self,
            p: &burn::module::Param<burn::tensor::Tensor<B, D>>,
        ) {
            self.0.push(p.val().dims().to_vec());
        }
    }
    let mut s = Shapes(vec![]);
    model.visit(&mut s);
    s.0
}

/// Saves the weights as safetensors (burn-store), written under a temporary name first;
/// returns the file's SHA-256 (hex), which the summary keeps.
pub fn save_weights<B: crate::ops::ModelBackend>(
    model: &Net<B>,
    path: &Path,
) -> Result<String, String> {
    use burn_store::{ModuleSnapshot, SafetensorsStore};
    let tmp = path.with_extension("safetensors.tmp");
    // Whatever is at the temporary name goes first: a link planted there was written
    // through (burn-store opens the file itself).
    let _ = std::fs::remove_file(&tmp);
    // One metadata entry: Burn's three are kept in a HashMap, written in a random order, so
    // two identical models made files that differed (and no checksum could say "the same").
    let producer = format!("runner {} (burn 0.21.0)", env!("CARGO_PKG_VERSION"));
    let mut store = SafetensorsStore::from_file(&tmp)
        .overwrite(true)
        .clear_metadata()
        .metadata("producer", producer);
    let saved = model
        .save_into(&mut store)
        .map_err(|e| format!("{}: {e}", path.display()))
        .and_then(|()| sha256_of(&tmp).map_err(|e| format!("{}: {e}", path.display())))
        .and_then(|sum| {
            std::fs::rename(&tmp, path)
                .map(|()| sum)
                .map_err(|e| format!("{}: {e}", path.display()))
        });
    if saved.is_err() {
        // On a full disk, the space it held is what the summary needs next.
        let _ = std::fs::remove_file(&tmp);
    }
    saved
}

/// A file's SHA-256, in hex, read in pieces (a ResNet-50's weights are 94 MB).
pub fn sha256_of(path: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match f.read(&mut buf)? {
            0 => break,
            n => h.update(&buf[..n]),
        }
    }
    Ok(h.finalize().iter().map(|x| format!("{x:02x}")).collect())
}

/// Loads weights saved by `save_weights` into a model of the same recipe.
pub fn load_weights<B: crate::ops::ModelBackend>(
    mut model: Net<B>,
    path: &Path,
) -> Result<Net<B>, String> {
    use burn_store::{ModuleSnapshot, SafetensorsStore};
    // burn-store takes a tensor in the file's type: an F16 one made a model whose first
    // product panicked, and an integer one a double free.
    if let Some((name, dtype)) = not_f32(path) {
        return Err(format!(
            "{}: tensor {name} is {dtype} in the file, F32 in the model: runner reads 32-bit float weights (as it saves them); convert the file's tensors to F32 (in PyTorch: `{{k: v.float() for k, v in state.items()}}`)",
            path.display()
        ));
    }
    // What does not fit is said below in words: burn-store's own report is written for
    // the program's author (how to call its API), not for whoever runs `runner eval`.
    let mut store = SafetensorsStore::from_file(path)
        .validate(false)
        .allow_partial(true);
    let result = model
        .load_from(&mut store)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some((first, _)) = result.missing.first() {
        let file_has = match result.unused.first() {
            Some(u) => format!("; the file's tensors are others' (e.g. {u})"),
            None => String::new(),
        };
        return Err(format!(
            "{}: holds no value for {} of the model's {} tensors (e.g. {first}){file_has}: was it saved from another recipe?",
            path.display(),
            result.missing.len(),
            result.missing.len() + result.applied.len() + result.errors.len(),
        ));
    }
    if let Some(e) = result.errors.first() {
        use burn_store::ApplyError;
        let first = match e {
            ApplyError::ShapeMismatch {
                path,
                expected,
                found,
            } => format!(
                "{path} is {:?} in the file, {:?} in the model",
                found.as_slice(),
                expected.as_slice()
            ),
            ApplyError::DTypeMismatch {
                path,
                expected,
                found,
            } => format!("{path} is {found:?} in the file, {expected:?} in the model"),
            other => other.to_string(),
        };
        return Err(format!(
            "{}: does not fit this recipe's model ({} tensor(s) differ, e.g. {first}): was it saved from another recipe?",
            path.display(),
            result.errors.len()
        ));
    }
    Ok(model.in_device_layouts())
}

/// The first tensor of a safetensors file that is not F32, by name, and its type, as the
/// file's header says (read alone: 8 bytes of length, then JSON). `None` where all are, and
/// where the header cannot be read, which the load then says.
fn not_f32(path: &Path) -> Option<(String, String)> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).ok()?;
    let len = u64::from_le_bytes(len);
    if len > f.metadata().ok()?.len().min(100 << 20) {
        return None;
    }
    let mut header = vec![0u8; len as usize];
    f.read_exact(&mut header).ok()?;
    let header: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&header).ok()?;
    header
        .into_iter()
        .filter(|(name, _)| name != "__metadata__")
        .find_map(|(name, t)| match t.get("dtype")?.as_str()? {
            "F32" => None,
            other => Some((name, other.to_string())),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state holding the floats a run records (evaluation losses, accuracies, times)
    /// verifies after the round trip through `state.json`. serde_json's default parser reads
    /// some 17-digit floats one bit off, so the checksum of the state read back differed
    /// from the one written, and a run that recorded evaluations could not resume from any
    /// of its checkpoints (the `float_roundtrip` feature reads them exactly).
    #[test]
    fn a_state_with_recorded_floats_verifies_after_its_json_round_trip() {
        // Values a quickstart run recorded that the default parser misread (the first by
        // 1 ulp: ...733 came back as ...732).
        let seen = [
            0.9294265508651733,
            1.2660926580429077,
            2.5400869999999998,
            1.8300776481628418,
            1.8621160984039307,
        ];
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            f64::from(f32::from_bits(0x3f80_0000 | (x >> 41) as u32))
        };
        let evals = (0..2000)
            .map(|i| crate::metrics::EvalRecord {
                epoch: i,
                step: i as u64,
                samples: 32,
                accuracy: next(),
                loss: seen.get(i).copied().unwrap_or_else(&mut next),
                ms: 2.5400869999999998 * next(),
            })
            .collect::<Vec<_>>();
        let mut state = State {
            step: 3,
            epoch: 0,
            batch: 3,
            epochs_completed: 0,
            metrics_lines: 3,
            recipe_sha256: "0".repeat(64),
            reason: "every 1 steps".into(),
            written_at: "2026-12-06T00:00:00Z".into(),
            best: Some((2, next())),
            since_best: 1,
            diverged_at_step: None,
            files: BTreeMap::new(),
            recorded: Some(Recorded {
                validations: evals.clone(),
                evals,
                checkpoints_before: 2,
                checkpoint_ms_before: 1000.0 * next(),
                startup_s: Some(next()),
                first_step_ms: Some(next()),
                loader_workers_started: Some(7),
                best_weights_sha256: Some("0f".repeat(32)),
            }),
            state_crc32: None,
        };
        state.state_crc32 = Some(state.checksum());
        let text = serde_json::to_string_pretty(&state).unwrap();
        let back: State = serde_json::from_str(&text).unwrap();
        assert_eq!(back, state, "a float changed in the round trip");
        verify(Path::new("/nonexistent"), &back).unwrap();
    }
}
