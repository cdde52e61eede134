//! Data sets held in host memory as raw bytes (`Images`), and the per-sample preparation
//! the loader's workers apply (augmentation, normalisation). Owns reading the sources the
//! recipe names; knows nothing of devices, tensors or batching order (`loader` does).

pub mod cifar;
pub mod pad;
pub mod spec;
pub mod sums;
pub mod synthetic;
pub mod text;

use std::fmt;
use std::path::{Path, PathBuf};

use crate::rng::SplitMix64;
use spec::{DataPlan, DataSource};

/// The most classes a model may have (each is a row of the last layer): labels above it
/// are taken for a data error, not a request for a huge model.
pub const MAX_CLASSES: usize = 100_000;

/// Images as bytes, `pixels[i * C*H*W ..]` planar (channel, row, column), with labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Images {
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    pub pixels: Vec<u8>,
    pub labels: Vec<u32>,
}

impl Images {
    pub fn len(&self) -> usize {
        self.labels.len()
    }
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
    pub fn sample_len(&self) -> usize {
        self.channels * self.height * self.width
    }
    pub fn sample(&self, i: usize) -> &[u8] {
        let n = self.sample_len();
        &self.pixels[i * n..(i + 1) * n]
    }
}

impl Dataset {
    /// The samples at `indices`, in that order.
    pub fn subset(&self, indices: &[usize]) -> Dataset {
        match self {
            Dataset::Images(im) => Dataset::Images(Images {
                pixels: indices
                    .iter()
                    .flat_map(|&i| im.sample(i).iter().copied())
                    .collect(),
                labels: indices.iter().map(|&i| im.labels[i]).collect(),
                ..im.clone_shape()
            }),
            Dataset::Text(t) => Dataset::Text(text::TextSet {
                seqs: indices.iter().map(|&i| t.seqs[i].clone()).collect(),
                labels: indices.iter().map(|&i| t.labels[i]).collect(),
            }),
        }
    }
}

/// A deterministic, class-stratified split: `held` of the samples (each class giving its
/// share, by largest remainder) chosen by `seed`; returns (kept, held) indices, each in
/// the data's order.
pub fn stratified_split(labels: &[u32], held: usize, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let n = labels.len();
    let mut by_class: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
    for (i, &l) in labels.iter().enumerate() {
        by_class.entry(l).or_default().push(i);
    }
    // Each class's exact share, floored; the remainders go to the largest fractions.
    let mut quota: Vec<(u32, usize, f64)> = by_class
        .iter()
        .map(|(&c, idx)| {
            let exact = held as f64 * idx.len() as f64 / n.max(1) as f64;
            (c, exact.floor() as usize, exact - exact.floor())
        })
        .collect();
    let mut left = held.saturating_sub(quota.iter().map(|q| q.1).sum());
    let mut order: Vec<usize> = (0..quota.len()).collect();
    order.sort_by(|&a, &b| quota[b].2.total_cmp(&quota[a].2).then(a.cmp(&b)));
    for &k in &order {
        if left == 0 {
            break;
        }
        if quota[k].1 < by_class[&quota[k].0].len() {
            quota[k].1 += 1;
            left -= 1;
        }
    }
    let mut is_held = vec![false; n];
    for (c, q, _) in quota {
        let mut idx = by_class[&c].clone();
        SplitMix64::new(seed ^ 0x5A11_D0A7_0000_0000)
            .fork(c as u64)
            .shuffle(&mut idx);
        for &i in idx.iter().take(q) {
            is_held[i] = true;
        }
    }
    (0..n).partition(|&i| !is_held[i])
}

/// Class names from a file beside `path` (`batches.meta.txt`, `labels.txt`): one per
/// line, line k naming label k - 1 (blank lines at the end are ignored). `Ok(None)` when
/// there is no such file; an error when there is one that cannot be used as such, rather
/// than a class count quietly taken from elsewhere.
pub fn names_beside(path: &Path, file: &str) -> Result<Option<Vec<String>>, DataError> {
    let Some(dir) = path.parent() else {
        return Ok(None);
    };
    let names_path = dir.join(file);
    let help = format!("{file} holds one class name per line, line k naming label k - 1");
    // Class names are short: a huge file is not a list of them (a 64 GiB one was read whole).
    const MAX_BYTES: u64 = 16 << 20;
    if let Ok(m) = std::fs::metadata(&names_path) {
        // A FIFO or a device there would block the read, or never end it.
        if !m.is_file() && !m.is_dir() {
            return Err(
                DataError::new(&names_path, "is not a regular file").help(format!(
                    "{help}; remove or rename what is there (a pipe or a device)"
                )),
            );
        }
        if m.is_file() && m.len() > MAX_BYTES {
            return Err(DataError::new(
                &names_path,
                format!(
                    "is {} bytes, too large for a list of class names (at most {MAX_BYTES})",
                    m.len()
                ),
            )
            .help(format!("{help}; is it the file you meant?")));
        }
    }
    let bytes = match std::fs::read(&names_path) {
        Ok(b) => b,
        // A link to nowhere is a names file meant and lost (a moved target), not none:
        // the classes were counted from the labels, their names dropped without a word.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return match std::fs::read_link(&names_path) {
                Ok(target) => Err(DataError::new(
                    &names_path,
                    format!(
                        "is a link to {}, which does not exist",
                        target.display()
                    ),
                )
                .help(format!(
                    "{help}; point the link at the class names, or remove it to count the classes from the labels"
                ))),
                Err(_) => Ok(None),
            };
        }
        Err(e) if names_path.is_dir() => {
            let _ = e;
            return Err(
                DataError::new(&names_path, "is a directory, not a list of class names")
                    .help(format!("{help}; remove or rename the directory")),
            );
        }
        Err(e) => return Err(DataError::io(&names_path, e)),
    };
    let text = String::from_utf8(bytes).map_err(|e| {
        let line = 1 + e.as_bytes()[..e.utf8_error().valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        DataError::new(&names_path, format!("line {line} is not UTF-8 text"))
            .help(format!("{help}, in UTF-8"))
    })?;
    // A byte-order mark (Windows editors write one) is not part of the first name.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let used = lines.len() - lines.iter().rev().take_while(|l| l.is_empty()).count();
    let names = &lines[..used];
    if names.is_empty() {
        return Err(DataError::new(&names_path, "holds no class name").help(help));
    }
    if text.replace("\r\n", "").contains('\r') {
        return Err(DataError::new(
            &names_path,
            "has lines ended by a carriage return alone (classic Mac OS line ends)",
        )
        .help(format!("{help}: save it with LF (or CRLF) line ends")));
    }
    let mut seen: std::collections::HashMap<&str, usize> = Default::default();
    for (i, name) in names.iter().enumerate() {
        if name.chars().any(|c| c.is_control() && c != '\t') {
            return Err(DataError::new(
                &names_path,
                format!("line {} holds a control character: not text", i + 1),
            )
            .help(format!("{help}, as plain text")));
        }
        if name.is_empty() {
            return Err(DataError::new(
                &names_path,
                format!(
                    "line {} is blank, so the names after it would name the wrong labels",
                    i + 1
                ),
            )
            .help(format!(
                "{help}; name that class, or remove the line if no label is {i}"
            )));
        }
        if let Some(first) = seen.insert(name, i) {
            return Err(DataError::new(
                &names_path,
                format!(
                    "line {} repeats the class name \"{name}\" of line {}",
                    i + 1,
                    first + 1
                ),
            )
            .help(format!("{help}; each class once")));
        }
    }
    Ok(Some(names.iter().map(|n| n.to_string()).collect()))
}

/// The bad lines or records of a file after the first one an error names: counted, and
/// the first few numbered, so the error says whether one line is bad or every one is.
#[derive(Default)]
pub(crate) struct MoreBad {
    count: usize,
    first: Vec<usize>,
}

impl MoreBad {
    /// How many further bad ones are numbered.
    const NAMED: usize = 5;

    /// One more bad line or record, numbered as the error numbers the first.
    pub(crate) fn add(&mut self, n: usize) {
        self.count += 1;
        if self.first.len() < Self::NAMED {
            self.first.push(n);
        }
    }

    /// `e` with the others said after it: "(and 41 more bad lines: 5, 9, 13, 20, 22, …)".
    pub(crate) fn said_after(self, mut e: DataError, what: &str) -> DataError {
        if self.count == 0 {
            return e;
        }
        let numbers: Vec<String> = self.first.iter().map(usize::to_string).collect();
        let more = if self.count > self.first.len() {
            ", …"
        } else {
            ""
        };
        let plural = if self.count == 1 { "" } else { "s" };
        e.message += &format!(
            " (and {} more bad {what}{plural}: {}{more})",
            self.count,
            numbers.join(", ")
        );
        e
    }
}

/// A data file that cannot be used, with its path and what to do.
#[derive(Debug, Clone)]
pub struct DataError {
    pub path: PathBuf,
    pub message: String,
    help: String,
}

impl DataError {
    pub fn new(path: &Path, message: impl Into<String>) -> Self {
        Self {
            path: path.to_path_buf(),
            message: message.into(),
            help: String::new(),
        }
    }
    pub fn io(path: &Path, e: std::io::Error) -> Self {
        if let Some(changed) = e.get_ref().and_then(|i| i.downcast_ref::<sums::Changed>()) {
            return Self::new(path, changed.to_string()).help(
                "something writes to it (a copy or download still going?): run again once it is written whole",
            );
        }
        if e.kind() == std::io::ErrorKind::OutOfMemory {
            let size = std::fs::metadata(path).map_or(0, |m| m.len());
            return Self::new(
                path,
                format!("cannot be held in memory ({size} bytes, read whole)"),
            )
            .help("use a smaller file, or run where there is more memory");
        }
        Self::new(path, format!("cannot be read: {e}")).help("check the path and its permissions")
    }
    pub fn help(mut self, h: impl Into<String>) -> Self {
        self.help = h.into();
        self
    }
    pub fn help_text(&self) -> &str {
        &self.help
    }
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{} {}", self.path.display(), self.message)
    }
}

impl std::error::Error for DataError {}

/// `there are 10 classes`, `there is 1 class`.
pub(crate) fn there_are_classes(n: usize) -> String {
    match n {
        1 => "there is 1 class".into(),
        n => format!("there are {n} classes"),
    }
}

/// A split held in memory: images as bytes, or text as token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Dataset {
    Images(Images),
    Text(text::TextSet),
}

impl Dataset {
    pub fn len(&self) -> usize {
        match self {
            Dataset::Images(i) => i.len(),
            Dataset::Text(t) => t.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn labels(&self) -> &[u32] {
        match self {
            Dataset::Images(i) => &i.labels,
            Dataset::Text(t) => &t.labels,
        }
    }
}

/// The training and test splits, and the tokenizer that made text splits.
pub struct Sets {
    pub train: Dataset,
    pub test: Dataset,
    /// Held out of the training set by `data.validation`.
    pub validation: Option<Dataset>,
    pub tokenizer: Option<text::Tokenizer>,
}

/// The training and test sets a plan names, read into memory; for text, the tokenizer is
/// built from the training split and encodes both.
pub fn load(plan: &DataPlan, classes: usize, seed: u64) -> Result<Sets, DataError> {
    let mut sets = read_sets(plan, classes, seed)?;
    if plan.validation_len > 0 && plan.validation_files.is_empty() {
        let (kept, held) = stratified_split(sets.train.labels(), plan.validation_len, seed);
        sets.validation = Some(sets.train.subset(&held));
        sets.train = sets.train.subset(&kept);
    }
    Ok(sets)
}

/// The test set alone, for `runner eval`: the training data is not read. Text is encoded
/// with `tokenizer`, the run's own (its `tokenizer.json`): one built again from a training
/// file changed since would give other ids.
pub fn load_test(
    plan: &DataPlan,
    classes: usize,
    seed: u64,
    tokenizer: Option<&text::Tokenizer>,
) -> Result<Dataset, DataError> {
    match &plan.source {
        DataSource::Cifar { test, .. } => {
            Ok(Dataset::Images(cifar::read(test, plan.test_len, classes)?))
        }
        DataSource::Synthetic { image, .. } => Ok(Dataset::Images(synthetic::generate(
            image,
            plan.classes,
            plan.test_len,
            seed,
            1,
        ))),
        DataSource::Jsonl { test, text: t, .. } => {
            let Some(test) = test else {
                return Ok(Dataset::Text(text::TextSet::default()));
            };
            let tok = tokenizer.expect("text is evaluated with the run's tokenizer");
            let rows = text::read_jsonl(
                test,
                &t.text_field,
                &t.label_field,
                Some(classes),
                plan.test_len,
            )?;
            Ok(Dataset::Text(encode(tok, rows, t.padding.max_length)))
        }
    }
}

/// Text rows as token ids (cut to `max_length`) and their labels.
fn encode(tok: &text::Tokenizer, rows: Vec<(String, u32)>, max_length: usize) -> text::TextSet {
    text::TextSet {
        seqs: rows
            .iter()
            .map(|(s, _)| tok.encode(s, max_length))
            .collect(),
        labels: rows.iter().map(|(_, l)| *l).collect(),
    }
}

/// The training (validation samples included) and test sets.
fn read_sets(plan: &DataPlan, classes: usize, seed: u64) -> Result<Sets, DataError> {
    let own_validation = !plan.validation_files.is_empty();
    // Held-out validation samples are read with the training set, then split off.
    let train_len = plan.train_len
        + if own_validation {
            0
        } else {
            plan.validation_len
        };
    match &plan.source {
        DataSource::Cifar { train, test, .. } => {
            read_cifar(plan, (train, test), train_len, classes)
        }
        DataSource::Synthetic { image, .. } => Ok(Sets {
            train: Dataset::Images(synthetic::generate(image, plan.classes, train_len, seed, 0)),
            test: Dataset::Images(synthetic::generate(
                image,
                plan.classes,
                plan.test_len,
                seed,
                1,
            )),
            validation: None,
            tokenizer: None,
        }),
        DataSource::Jsonl {
            train,
            test,
            text: t,
        } => read_text(
            plan,
            (train, test.as_deref()),
            t,
            (train_len, classes),
            seed,
        ),
    }
}

/// CIFAR-10 binary files: training, test and a validation set of its own.
fn read_cifar(
    plan: &DataPlan,
    (train, test): (&[PathBuf], &[PathBuf]),
    train_len: usize,
    classes: usize,
) -> Result<Sets, DataError> {
    let own_validation = !plan.validation_files.is_empty();
    let tr = cifar::read(train, train_len, classes)?;
    let te = if test.is_empty() {
        Images {
            pixels: vec![],
            labels: vec![],
            ..tr.clone_shape()
        }
    } else {
        cifar::read(test, plan.test_len, classes)?
    };
    let validation = if own_validation {
        Some(Dataset::Images(cifar::read(
            &plan.validation_files,
            plan.validation_len,
            classes,
        )?))
    } else {
        None
    };
    Ok(Sets {
        train: Dataset::Images(tr),
        test: Dataset::Images(te),
        validation,
        tokenizer: None,
    })
}

/// JSONL text: read, the tokenizer built from the training part (not its held-out
/// validation samples), every set encoded.
fn read_text(
    plan: &DataPlan,
    (train, test): (&Path, Option<&Path>),
    t: &spec::TextPlan,
    (train_len, classes): (usize, usize),
    seed: u64,
) -> Result<Sets, DataError> {
    let own_validation = !plan.validation_files.is_empty();
    let read =
        |p: &Path, n: usize| text::read_jsonl(p, &t.text_field, &t.label_field, Some(classes), n);
    let tr = read(train, train_len)?;
    // The vocabulary comes from the training part only: the validation samples are
    // as unseen as the test set.
    let held = if plan.validation_len > 0 && !own_validation {
        let labels: Vec<u32> = tr.iter().map(|(_, l)| *l).collect();
        stratified_split(&labels, plan.validation_len, seed).1
    } else {
        vec![]
    };
    let te = match test {
        Some(p) => read(p, plan.test_len)?,
        None => vec![],
    };
    let k = &t.tokenizer;
    let pad_id = t.padding.pad_id;
    let tok = match k.kind {
        crate::recipe::TokenizerKind::Word => {
            let mut is_held = vec![false; tr.len()];
            held.iter().for_each(|&i| is_held[i] = true);
            let texts: Vec<&str> = tr
                .iter()
                .zip(&is_held)
                .filter(|(_, h)| !**h)
                .map(|((s, _), _)| s.as_str())
                .collect();
            text::Tokenizer::build_word(&texts, k.max_vocab, k.min_freq, k.lowercase, pad_id)
        }
        crate::recipe::TokenizerKind::Byte => text::Tokenizer::byte(k.lowercase, pad_id),
    };
    let encode = |v: Vec<(String, u32)>| encode(&tok, v, t.padding.max_length);
    let validation = match plan.validation_files.first() {
        Some(p) => Some(Dataset::Text(encode(read(p, plan.validation_len)?))),
        None => None,
    };
    Ok(Sets {
        train: Dataset::Text(encode(tr)),
        test: Dataset::Text(encode(te)),
        validation,
        tokenizer: Some(tok),
    })
}

/// What the loader's workers do to a batch's samples, for either kind of data.
#[derive(Debug, Clone)]
pub enum Collate {
    Images(Prepare),
    Text(pad::Padding),
}

/// A batch's inputs on the host.
#[derive(Debug, Clone, PartialEq)]
pub enum HostData {
    Pixels(Pixels),
    Tokens(pad::TokenBatch),
}

impl Collate {
    pub fn batch(&self, data: &Dataset, indices: &[usize], epoch: usize, train: bool) -> HostData {
        match (self, data) {
            (Collate::Images(p), Dataset::Images(d)) => {
                HostData::Pixels(p.batch(d, indices, epoch, train))
            }
            (Collate::Text(p), Dataset::Text(d)) => HostData::Tokens(p.collate(d, indices)),
            _ => unreachable!("validation pairs image data with image preparation"),
        }
    }
}

impl Images {
    fn clone_shape(&self) -> Images {
        Images {
            channels: self.channels,
            height: self.height,
            width: self.width,
            pixels: vec![],
            labels: vec![],
        }
    }
}

/// Per-sample preparation on the host: random crop and flip (training only), then bytes
/// either stay bytes (normalised later on the device) or become normalised f32.
#[derive(Debug, Clone)]
pub struct Prepare {
    pub crop_padding: usize,
    pub hflip: bool,
    /// `Some((scale, shift))` per channel: `x * scale + shift` on the host; `None` keeps bytes.
    pub host_affine: Option<Vec<(f32, f32)>>,
    pub seed: u64,
}

/// Host batch contents: what crosses to the device.
#[derive(Debug, Clone, PartialEq)]
pub enum Pixels {
    F32(Vec<f32>),
    U8(Vec<u8>),
}

impl Prepare {
    /// `x/255` then `(x - mean) / std`, folded into one multiply-add per channel.
    pub fn affine(mean: &[f32], std: &[f32]) -> Vec<(f32, f32)> {
        mean.iter()
            .zip(std)
            .map(|(m, s)| (1.0 / (255.0 * s), -m / s))
            .collect()
    }

    /// Builds one batch's pixels from sample indices; augmentation draws come from
    /// (seed, epoch, sample index), so they do not depend on which worker runs this.
    pub fn batch(&self, data: &Images, indices: &[usize], epoch: usize, train: bool) -> Pixels {
        let n = data.sample_len();
        let mut bytes = vec![0u8; indices.len() * n];
        for (out, &i) in bytes.chunks_exact_mut(n).zip(indices) {
            let src = data.sample(i);
            if train && (self.crop_padding > 0 || self.hflip) {
                let mut rng = SplitMix64::new(self.seed ^ 0xA5A5_0000_0000_0000)
                    .fork(epoch as u64)
                    .fork(i as u64);
                self.augment(data, src, out, &mut rng);
            } else {
                out.copy_from_slice(src);
            }
        }
        match &self.host_affine {
            None => Pixels::U8(bytes),
            Some(aff) => {
                let plane = data.height * data.width;
                let mut f = Vec::with_capacity(bytes.len());
                for (k, b) in bytes.iter().enumerate() {
                    let (scale, shift) = aff[(k / plane) % data.channels];
                    f.push(*b as f32 * scale + shift);
                }
                Pixels::F32(f)
            }
        }
    }

    fn augment(&self, data: &Images, src: &[u8], out: &mut [u8], rng: &mut SplitMix64) {
        let (h, w, p) = (
            data.height as isize,
            data.width as isize,
            self.crop_padding as isize,
        );
        // Offsets into the zero-padded image, as torchvision's RandomCrop(size, padding=p).
        let (dy, dx) = if p > 0 {
            (
                rng.below(2 * p as u64 + 1) as isize - p,
                rng.below(2 * p as u64 + 1) as isize - p,
            )
        } else {
            (0, 0)
        };
        let flip = self.hflip && rng.below(2) == 1;
        for c in 0..data.channels as isize {
            for y in 0..h {
                for x in 0..w {
                    let sy = y + dy;
                    let sx0 = if flip { w - 1 - x } else { x };
                    let sx = sx0 + dx;
                    let v = if (0..h).contains(&sy) && (0..w).contains(&sx) {
                        src[(c * h * w + sy * w + sx) as usize]
                    } else {
                        0
                    };
                    out[(c * h * w + y * w + x) as usize] = v;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A class-name file is used as it is or refused with its line: never skipped for a
    /// count from elsewhere (10, or the largest label + 1), nor read with lines dropped.
    #[test]
    fn class_name_files_are_used_whole_or_refused() {
        let dir = crate::scratch::Scratch::new("names");
        let data = dir.join("data_batch.bin");
        let names = |bytes: &[u8]| {
            let f = dir.join("batches.meta.txt");
            let _ = std::fs::remove_dir_all(&f);
            std::fs::write(&f, bytes).unwrap();
            names_beside(&data, "batches.meta.txt").map_err(|e| e.message)
        };
        assert_eq!(names_beside(&data, "batches.meta.txt").unwrap(), None);
        assert_eq!(
            names(b"cat\ndog\n\n\n"),
            Ok(Some(vec!["cat".into(), "dog".into()]))
        );
        assert_eq!(names(b"\n\n"), Err("holds no class name".into()));
        assert!(names(b"cat\n\ndog\n")
            .unwrap_err()
            .starts_with("line 2 is blank"));
        assert_eq!(
            names(b"cat\ndog\ncat\n"),
            Err("line 3 repeats the class name \"cat\" of line 1".into())
        );
        assert_eq!(
            names(b"cat\ncaf\xe9\n"),
            Err("line 2 is not UTF-8 text".into())
        );
        std::fs::remove_file(dir.join("batches.meta.txt")).unwrap();
        std::fs::create_dir(dir.join("batches.meta.txt")).unwrap();
        let e = names_beside(&data, "batches.meta.txt").unwrap_err();
        assert!(e.message.contains("is a directory"), "{}", e.message);
        // A link to nowhere: a names file meant (it read as none, the names dropped).
        std::fs::remove_dir(dir.join("batches.meta.txt")).unwrap();
        std::os::unix::fs::symlink("moved.txt", dir.join("batches.meta.txt")).unwrap();
        let e = names_beside(&data, "batches.meta.txt").unwrap_err();
        assert_eq!(e.message, "is a link to moved.txt, which does not exist");
    }

    fn tiny() -> Images {
        Images {
            channels: 1,
            height: 2,
            width: 3,
            pixels: vec![1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 50, 60],
            labels: vec![0, 1],
        }
    }

    #[test]
    fn the_validation_split_is_stratified_deterministic_and_disjoint() {
        let labels: Vec<u32> = (0..70)
            .map(|i| {
                if i < 40 {
                    0
                } else if i < 60 {
                    1
                } else {
                    2
                }
            })
            .collect();
        let (kept, held) = stratified_split(&labels, 14, 3);
        assert_eq!(held.len(), 14);
        let per_class = |idx: &[usize], c| idx.iter().filter(|&&i| labels[i] == c).count();
        assert_eq!([0, 1, 2].map(|c| per_class(&held, c)), [8, 4, 2]);
        let mut all: Vec<usize> = kept.iter().chain(&held).copied().collect();
        all.sort();
        assert_eq!(all, (0..70).collect::<Vec<_>>());
        assert_eq!(stratified_split(&labels, 14, 3), (kept, held.clone()));
        assert_ne!(
            stratified_split(&labels, 14, 4).1,
            held,
            "the seed picks the samples"
        );
    }

    #[test]
    fn host_normalisation_is_x_over_255_minus_mean_over_std() {
        let p = Prepare {
            crop_padding: 0,
            hflip: false,
            host_affine: Some(Prepare::affine(&[0.5], &[0.25])),
            seed: 0,
        };
        let Pixels::F32(v) = p.batch(&tiny(), &[1], 0, true) else {
            panic!()
        };
        let want: Vec<f32> = [10., 20., 30., 40., 50., 60.]
            .iter()
            .map(|x| (x / 255.0 - 0.5) / 0.25)
            .collect();
        for (a, b) in v.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn augmentation_depends_on_sample_and_epoch_only() {
        let p = Prepare {
            crop_padding: 1,
            hflip: true,
            host_affine: None,
            seed: 3,
        };
        let d = tiny();
        let a = p.batch(&d, &[0, 1], 0, true);
        let b = p.batch(&d, &[1], 0, true);
        let Pixels::U8(a) = a else { panic!() };
        let Pixels::U8(b) = b else { panic!() };
        assert_eq!(
            &a[6..],
            &b[..],
            "sample 1 must not depend on its batch mates"
        );
        let differs = (0..20).any(|e| p.batch(&d, &[1], e, true) != p.batch(&d, &[1], 0, true));
        assert!(differs, "augmentation never changes across epochs");
        assert_eq!(
            p.batch(&d, &[1], 0, false),
            Pixels::U8(d.sample(1).to_vec()),
            "eval batches are not augmented"
        );
    }

    #[test]
    fn flip_mirrors_rows() {
        let p = Prepare {
            crop_padding: 0,
            hflip: true,
            host_affine: None,
            seed: 0,
        };
        let d = tiny();
        // Find an epoch where sample 0 is flipped.
        let flipped = (0..64)
            .map(|e| p.batch(&d, &[0], e, true))
            .find(|b| *b != Pixels::U8(d.sample(0).to_vec()))
            .expect("never flipped in 64 epochs");
        assert_eq!(flipped, Pixels::U8(vec![3, 2, 1, 6, 5, 4]));
    }
}
