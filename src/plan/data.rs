//! The `[data]` and `[padding]` rules and the cheap file checks: dataset files exist and
//! hold whole records with labels in range (CIFAR), lines parse (JSONL); the validation split.

use super::*;

/// `padding.buckets` where the recipe does not say.
const DEFAULT_BUCKETS: usize = 8;

/// A format's files (or generated set), before the samples' plan is attached.
enum Files {
    Cifar {
        train: Vec<PathBuf>,
        test: Vec<PathBuf>,
    },
    Synthetic {
        samples: usize,
        test_samples: usize,
    },
    Jsonl {
        train: PathBuf,
        test: Option<PathBuf>,
        seen: TextSeen,
    },
}

/// What a data format's checks found.
struct Found {
    files: Files,
    /// Image channels and side (0 for text).
    channels: usize,
    size: usize,
    classes: usize,
    train_total: usize,
    test_total: usize,
}

impl<'a> Validator<'a> {
    pub(super) fn data(&mut self, machine: &Machine) -> Option<DataPlan> {
        let d = &self.recipe().data;
        let Some(format) = d.format else {
            self.err(
                "data.format",
                "missing: every recipe names its data",
                "add `format = \"cifar10-bin\"` (with train = \"...\") or `format = \"synthetic\"` under [data]",
            );
            return None;
        };
        let Found {
            files,
            channels,
            size,
            classes,
            train_total,
            test_total,
        } = match format {
            DataFormat::Cifar10Bin => self.cifar_data(machine)?,
            DataFormat::Jsonl => self.jsonl_data(machine)?,
            DataFormat::Synthetic => self.synthetic_data()?,
        };
        let (train_len, validation_len) = self.split(train_total);
        let (validation_len, validation_files, validation_longest) =
            self.validation_file(format, classes, validation_len, machine)?;
        let test_len = d.test_limit.map_or(test_total, |n| n.min(test_total));
        if d.test_limit.is_some() && test_total == 0 {
            self.err(
                "data.test_limit",
                "there is no test data to limit",
                "set data.test, or remove the key",
            );
        }
        let normalize = self.normalize(channels);
        let a = d.augment.clone().unwrap_or_default();
        if size > 0 && a.crop_padding > size / 2 {
            self.err(
                "data.augment.crop_padding",
                format!(
                    "{} pixels of padding for {size}-pixel images",
                    a.crop_padding
                ),
                format!("use at most {}", size / 2),
            );
        }
        self.kind_keys(format == DataFormat::Jsonl);
        let image = ImagePlan {
            channels,
            height: size,
            width: size,
            normalize,
            crop_padding: a.crop_padding,
            hflip: a.hflip,
        };
        let (train_files, test_files): (Vec<&Path>, Vec<&Path>) = match &files {
            // The files data.limit reaches: those past it are never trained on.
            Files::Cifar { train, test } => {
                let limit = self.recipe().data.limit.unwrap_or(usize::MAX);
                let mut before = 0usize;
                let reached = train.iter().take_while(|f| {
                    let reached = before < limit;
                    let len = std::fs::metadata(f).map_or(0, |m| m.len());
                    before = before
                        .saturating_add(usize::try_from(len).unwrap_or(usize::MAX) / cifar::RECORD);
                    reached
                });
                (
                    reached.map(PathBuf::as_path).collect(),
                    test.iter().map(PathBuf::as_path).collect(),
                )
            }
            Files::Jsonl { train, test, .. } => {
                (vec![train], test.iter().map(|t| t.as_path()).collect())
            }
            Files::Synthetic { .. } => (vec![], vec![]),
        };
        let validation: Vec<&Path> = validation_files.iter().map(PathBuf::as_path).collect();
        for (key, held) in [
            ("data.test", &test_files),
            ("data.validation_file", &validation),
        ] {
            self.same_as_training(&train_files, key, held);
        }
        let source = match files {
            Files::Cifar { train, test } => DataSource::Cifar { train, test, image },
            Files::Synthetic {
                samples,
                test_samples,
            } => DataSource::Synthetic {
                samples,
                test_samples,
                image,
            },
            Files::Jsonl {
                train,
                test,
                mut seen,
            } => {
                // Validation batches are padded as training's are: their longest row counts.
                seen.longest = seen.longest.max(validation_longest);
                DataSource::Jsonl {
                    train,
                    test,
                    text: self.text_plan(seen),
                }
            }
        };
        Some(DataPlan {
            source,
            classes,
            train_len,
            test_len,
            validation_len,
            validation_files,
        })
    }

    /// `cifar10-bin`: the files, their record counts and labels (read now, so a bad byte
    /// is an error before anything runs), the class names.
    fn cifar_data(&mut self, machine: &Machine) -> Option<Found> {
        let d = &self.recipe().data;
        self.only_for("data.synthetic", "to format = \"synthetic\"");
        let Some(train) = &d.train else {
            self.err(
                "data.train",
                "missing: format \"cifar10-bin\" needs training data",
                "set train = \"path/to/data_batch.bin\" (a file, or a directory of data_batch_*.bin), relative to the recipe",
            );
            return None;
        };
        // Both files are looked at before either error returns: every finding at once.
        let train = self.cifar_files("data.train", train, "data_batch");
        let test = match &d.test {
            Some(t) => self.cifar_files("data.test", t, "test_batch"),
            None => Some(vec![]),
        };
        let train_n = train
            .as_ref()
            .and_then(|t| self.count_records("data.train", t));
        let test_n = test
            .as_ref()
            .and_then(|t| self.count_records("data.test", t));
        // The training labels are checked also when the test set cannot be used: its
        // error hid theirs until it was fixed.
        let (train, train_n) = (train?, train_n?);
        let (test, test_n) = match (test, test_n) {
            (Some(t), Some(n)) => (Some(t), n),
            _ => (None, 0),
        };
        let names = match cifar::class_names(&train[0]) {
            Ok(names) => names,
            Err(e) => {
                self.data_err("data.train", &e);
                return None;
            }
        };
        if let Some(first) = test.as_ref().and_then(|t| t.first()) {
            self.same_classes(names.as_deref(), first, cifar::class_names);
        }
        let classes = names.as_ref().map_or(10, |n| n.len());
        // Data that cannot be held is refused here, by its size: its labels are not read
        // first (100 GB of them took minutes before the memory check refused it). What is
        // held is what the limits keep.
        let image_bytes = |n: usize, limit: Option<usize>| {
            (n.min(limit.unwrap_or(usize::MAX)) as u64).saturating_mul(cifar::PIXELS as u64)
        };
        let parts = [
            ("data.train", image_bytes(train_n, d.limit)),
            ("data.test", image_bytes(test_n, d.test_limit)),
        ];
        let read = self.image_room(&parts, machine);
        // Labels are read now, so a bad byte is an error before anything runs: every
        // file's, each with its own count of bad records.
        let train_labels = read.then(|| self.labels_of("data.train", &train, classes, d.limit));
        let test_labels = match &test {
            Some(t) if read => Some(self.labels_of("data.test", t, classes, d.test_limit)),
            _ => None,
        };
        let test = test?;
        if matches!(train_labels, Some(None)) || matches!(test_labels, Some(None)) {
            return None;
        }
        if let Some(Some(found)) = &train_labels {
            // Of the records the limits keep: those past them are never read.
            let used = |found: &[cifar::Labels], limit: Option<usize>| {
                found
                    .iter()
                    .flat_map(|f| f.labels.iter().map(|&l| u32::from(l)))
                    .take(limit.unwrap_or(usize::MAX))
                    .collect::<Vec<u32>>()
            };
            let trained = self.trained_labels(&used(found, d.limit));
            self.one_class(&trained, "cifar10-bin");
            if let Some(Some(tested)) = &test_labels {
                let tested = used(tested, d.test_limit).into_iter().collect();
                self.untrained_classes(&trained, &tested, None);
            }
        }
        if classes > crate::data::MAX_CLASSES {
            self.err(
                "data.train",
                format!(
                    "{} names {classes} classes, over the cap of {}",
                    train[0].with_file_name("batches.meta.txt").display(),
                    crate::data::MAX_CLASSES
                ),
                "batches.meta.txt holds one class name per line",
            );
        }
        Some(Found {
            files: Files::Cifar { train, test },
            channels: 3,
            size: 32,
            classes,
            train_total: train_n,
            test_total: test_n,
        })
    }

    /// Whether image data of these `(key, bytes)` parts fits in the host memory this
    /// process may use (or the cap of any machine); if not, the error, at the key of the
    /// larger part, with the limit that cuts it.
    fn image_room(&mut self, parts: &[(&str, u64)], machine: &Machine) -> bool {
        let (room, what) = super::resources::host_room(machine);
        let held = parts.iter().fold(0u64, |a, (_, b)| a.saturating_add(*b));
        if held <= room {
            return true;
        }
        let (key, bytes) = parts
            .iter()
            .max_by_key(|(_, b)| *b)
            .copied()
            .unwrap_or(("data.train", 0));
        let gib = super::resources::gib;
        // The most images of the larger part that fit beside the others.
        let fits = room.saturating_sub(held - bytes) / cifar::PIXELS as u64;
        let help = match key {
            "data.train" => format!("set data.limit to at most {fits} (the training images that fit)"),
            "data.test" => format!("set data.test_limit to at most {fits} (the test images that fit)"),
            _ => "give it a smaller file, or hold out part of the training data instead (data.validation)".into(),
        };
        self.err(
            key,
            format!(
                "the data takes {} in memory ({} images of {} bytes), more than {what} ({})",
                gib(held),
                held / cifar::PIXELS as u64,
                cifar::PIXELS,
                gib(room)
            ),
            help,
        );
        false
    }

    /// Whether the JSONL files of these keys can be read: each is read whole, and its texts
    /// held beside it, so twice its size must fit in the host memory this process may use
    /// (a 64 GiB file aborted the process allocating it). If not, the error at its key.
    fn text_room(&mut self, files: &[(&str, &Path)], machine: &Machine) -> bool {
        let (room, what) = super::resources::host_room(machine);
        let gib = super::resources::gib;
        let mut ok = true;
        for (key, path) in files {
            let size = std::fs::metadata(path).map_or(0, |m| m.len());
            if size.saturating_mul(2) > room {
                self.err(
                    key,
                    format!(
                        "{} is {}: read whole, with its texts beside it, it needs about {}, more than {what} ({})",
                        crate::recipe::lexical(path).display(),
                        gib(size),
                        gib(size.saturating_mul(2)),
                        gib(room)
                    ),
                    "use a smaller file (data.limit keeps its first texts, but the file is read whole), or run where there is more memory",
                );
                ok = false;
            }
        }
        ok
    }

    /// The labels of the CIFAR-10 files, where every label byte is a class (of `classes`,
    /// or of `model.num_classes` if more): every file's error is given, each with its
    /// count. Of the records the first `limit` take (in the files' order), a file of zero
    /// bytes only is an error too, and zero records at a file's end a warning.
    fn labels_of(
        &mut self,
        key: &str,
        files: &[PathBuf],
        classes: usize,
        limit: Option<usize>,
    ) -> Option<Vec<cifar::Labels>> {
        let allowed = self.recipe().model.num_classes.unwrap_or(0).max(classes);
        let mut out = Some(vec![]);
        // Records of the files before this one.
        let mut before = 0usize;
        for f in files {
            match cifar::check_labels(f, allowed) {
                Ok(found) => {
                    let used = limit.map_or(usize::MAX, |l| l.saturating_sub(before));
                    before += found.labels.len();
                    if self.blank_records(key, f, &found, used) {
                        out = None;
                    }
                    if let Some(out) = &mut out {
                        out.push(found);
                    }
                }
                Err(e) => {
                    self.data_err(key, &e);
                    out = None;
                }
            }
        }
        out
    }

    /// Records of zero bytes only at the end of a CIFAR-10 file, of its first `used`
    /// (those a limit keeps): black images of class 0 that a file allocated ahead, or a
    /// copy cut short and padded, holds past what was written. All of them: an error (it
    /// trained in silence), and `true`; some: a warning.
    fn blank_records(
        &mut self,
        key: &str,
        file: &Path,
        found: &cifar::Labels,
        used: usize,
    ) -> bool {
        let (n, blank) = (found.labels.len(), found.blank_tail);
        let first = n - blank;
        let shown = crate::recipe::lexical(file);
        let (would, are) = match key {
            "data.train" => ("would train", "train"),
            "data.test" => ("would be scored", "are scored"),
            _ => ("would be validated on", "are validated on"),
        };
        if blank == 0 || first >= used {
            false
        } else if blank == n {
            self.err(
                key,
                format!(
                    "{} holds zero bytes only: its {n} record(s) {would} as black images of class 0",
                    shown.display()
                ),
                "check the file (was it written whole? a file allocated ahead, or a copy cut short, reads so), and point the key at the data",
            );
            true
        } else {
            self.warn(
                key,
                format!(
                    "{}: its last {blank} of {n} records (from record {first}, byte offset {}) are zero bytes only, which {are} as black images of class 0",
                    shown.display(),
                    first * cifar::RECORD
                ),
                format!(
                    "check the file: a copy cut short and padded, or a file allocated ahead, ends so; if the records before them are whole, cut the zeros off (truncate -s {} FILE)",
                    first * cifar::RECORD
                ),
            );
            false
        }
    }

    /// A warning where the class names beside the test file are not the training data's:
    /// its labels then mean other classes (a Fashion-MNIST model scored on CIFAR-10's
    /// test set), and its accuracy means nothing. Silent where either has no names file;
    /// one beside the test file that cannot be used is an error, as beside the training
    /// file (where it is checked as it is read).
    fn same_classes(
        &mut self,
        train: Option<&[String]>,
        test: &Path,
        read: fn(&Path) -> Result<Option<Vec<String>>, crate::data::DataError>,
    ) {
        let theirs = match read(test) {
            Ok(theirs) => theirs,
            // A names file beside the test file that cannot be used (a link to nowhere, a
            // blank line) is said, as beside the training file (it was passed over).
            Err(e) => {
                self.data_err("data.test", &e);
                return;
            }
        };
        let (Some(train), Some(theirs)) = (train, theirs) else {
            return;
        };
        let n = train.len().max(theirs.len());
        let Some(k) = (0..n).find(|&k| train.get(k) != theirs.get(k)) else {
            return;
        };
        let name = |v: Option<&String>| v.map_or("no class".into(), |s| format!("{s:?}"));
        self.warn(
            "data.test",
            format!(
                "its classes are not the training data's: label {k} is {} beside the test file and {} beside the training file ({} against {} classes)",
                name(theirs.get(k)),
                name(train.get(k)),
                theirs.len(),
                train.len()
            ),
            "score a test set of the classes the model was trained on (the names files beside both files say which)",
        );
    }

    /// `jsonl`: the files, every line parsed for its text and label, the classes.
    fn jsonl_data(&mut self, machine: &Machine) -> Option<Found> {
        let d = &self.recipe().data;
        self.only_for("data.synthetic", "to format = \"synthetic\"");
        let Some(train) = &d.train else {
            self.err(
                "data.train",
                "missing: format \"jsonl\" needs training data",
                "set train = \"path/to/train.jsonl\", relative to the recipe",
            );
            return None;
        };
        let (tf, lf) = (
            d.text_field.clone().unwrap_or("text".into()),
            d.label_field.clone().unwrap_or("label".into()),
        );
        let train = self.jsonl_file("data.train", train);
        let test = d.test.as_ref().map(|t| self.jsonl_file("data.test", t));
        // A test file that cannot be used (its error is given) does not keep the training
        // file from being read: both findings at once.
        let (train, test, test_failed) = match (train, test) {
            (Some(train), None) => (train, None, false),
            (Some(train), Some(Some(test))) => (train, Some(test), false),
            (Some(train), Some(None)) => (train, None, true),
            (None, _) => return None,
        };
        let files: Vec<(&str, &Path)> =
            [("data.train", Some(&train)), ("data.test", test.as_ref())]
                .into_iter()
                .filter_map(|(k, p)| Some((k, p?.as_path())))
                .collect();
        if !self.text_room(&files, machine) {
            return None;
        }
        let names = match crate::data::text::class_names(&train) {
            Ok(names) => names,
            Err(e) => {
                self.data_err("data.train", &e);
                return None;
            }
        };
        if let Some(test) = &test {
            self.same_classes(names.as_deref(), test, crate::data::text::class_names);
        }
        let named = names.as_ref().map(|n| n.len());
        // A count too small for a classifier is said at its key (model.num_classes), not
        // as every line's label out of range.
        let limit = self
            .recipe()
            .model
            .num_classes
            .filter(|&n| n >= 2)
            .or(named);
        let mut max_label = 0;
        let mut train_max = 0;
        let mut distinct = std::collections::BTreeSet::new();
        let mut counts = [0usize; 2];
        let mut train_labels = std::collections::BTreeSet::new();
        let mut test_labels: Option<std::collections::BTreeSet<u32>> = None;
        let max_length = self.recipe().padding.clone().unwrap_or_default().max_length;
        // `cut` of the `used` training texts (the first `data.limit`) are cut to max_length.
        let (mut cut, mut train_longest, mut used) = (0, 0, 0);
        let mut bad = false;
        let tokenizer = self.recipe().data.tokenizer.clone().unwrap_or_default();
        let mut seen = TextSeen {
            longest: 1,
            words: 0,
        };
        let mut used_words = 0;
        let mut kept_labels: Option<std::collections::BTreeSet<u32>> = None;
        let mut trained: Option<std::collections::BTreeSet<u32>> = None;
        for (i, (key, path)) in [("data.train", Some(&train)), ("data.test", test.as_ref())]
            .into_iter()
            .enumerate()
        {
            let Some(path) = path else { continue };
            match crate::data::text::scan_jsonl(path, &tf, &lf, limit, tokenizer.lowercase) {
                Ok(scan) => {
                    counts[i] = scan.rows;
                    // Of the texts the limits keep: those past them are never read.
                    let first = match i {
                        0 => self.recipe().data.limit,
                        _ => self.recipe().data.test_limit,
                    }
                    .unwrap_or(usize::MAX);
                    self.texts_without_tokens(key, path, &scan, tokenizer.kind, first);
                    if i == 0 {
                        // The vocabulary is built from the texts used only, less those
                        // `data.validation` holds out (as `data::load` splits them), and
                        // only the used texts' labels are trained.
                        let held = self.held_out(first.min(scan.rows));
                        let rows = (first < scan.rows || held > 0)
                            .then(|| {
                                crate::data::text::read_jsonl(path, &tf, &lf, limit, first).ok()
                            })
                            .flatten();
                        let freqs = match &rows {
                            Some(rows) => {
                                let labels: Vec<u32> = rows.iter().map(|(_, l)| *l).collect();
                                let seed = self.recipe().seed;
                                let kept = crate::data::stratified_split(&labels, held, seed).0;
                                crate::data::text::word_counts(
                                    kept.iter().map(|&k| rows[k].0.as_str()),
                                    tokenizer.lowercase,
                                )
                            }
                            None => scan.word_freqs.clone(),
                        };
                        self.vocabulary_left(freqs.first().copied().unwrap_or(0), &tokenizer);
                        used_words = crate::data::text::kept_words(
                            &freqs,
                            tokenizer.min_freq,
                            tokenizer.max_vocab,
                        );
                        // Trained on: the texts used, less those held out for validation.
                        trained = rows.as_ref().filter(|_| held > 0).map(|rows| {
                            let labels: Vec<u32> = rows.iter().map(|(_, l)| *l).collect();
                            self.trained_labels(&labels)
                        });
                        kept_labels = rows
                            .filter(|_| first < scan.rows)
                            .map(|rows| rows.iter().map(|(_, l)| *l).collect());
                    }
                    seen.longest = seen.longest.max(match tokenizer.kind {
                        crate::recipe::TokenizerKind::Word => scan.longest_words,
                        crate::recipe::TokenizerKind::Byte => scan.longest_bytes,
                    });
                    // The vocabulary is built from the training file.
                    if i == 0 {
                        seen.words = used_words;
                        train_labels = kept_labels.clone().unwrap_or_else(|| scan.labels.clone());
                        let first = self.recipe().data.limit.unwrap_or(usize::MAX);
                        (cut, train_longest) = scan.longer_than(tokenizer.kind, max_length, first);
                        used = scan.rows.min(first);
                    }
                    let top = scan.labels.last().map_or(0, |&l| l as usize);
                    max_label = max_label.max(top);
                    match i {
                        0 => train_max = top,
                        // Of the texts data.test_limit keeps: those past it are not scored.
                        _ if first < scan.rows => {
                            test_labels =
                                crate::data::text::read_jsonl(path, &tf, &lf, limit, first)
                                    .ok()
                                    .map(|rows| rows.iter().map(|(_, l)| *l).collect());
                        }
                        _ => test_labels = Some(scan.labels.clone()),
                    }
                    distinct.extend(scan.labels);
                }
                // The other file is read too: its findings with this one's.
                Err(e) => {
                    self.data_err(key, &e);
                    bad = true;
                }
            }
        }
        if bad || test_failed {
            return None;
        }
        let classes = named.unwrap_or(max_label + 1).max(2);
        // Classes are counted from both files: a label only the test set has adds outputs
        // that training never sees.
        if limit.is_none() && max_label > train_max {
            self.warn(
                "data.test",
                format!(
                    "label {max_label} occurs in the test set, but training labels run up to {train_max}: the model gets {classes} classes, and those above {train_max} are never trained"
                ),
                "check the test file's labels, or name the classes in labels.txt beside the training file",
            );
        }
        // Labels only the texts past data.limit have still count as classes, never trained.
        let kept_max = train_labels.last().map_or(0, |&l| l as usize);
        // (A limit of 0 is an error of its own, said at its key.)
        if limit.is_none()
            && kept_labels.is_some()
            && self.recipe().data.limit != Some(0)
            && train_max > kept_max
            && max_label == train_max
        {
            self.warn(
                "data.limit",
                format!(
                    "label {train_max} occurs in the training file past its first {} texts: the model gets {classes} classes, and those above {kept_max} are never trained",
                    self.recipe().data.limit.unwrap_or(0)
                ),
                "name the classes in labels.txt beside the training file, or raise data.limit",
            );
        }
        // Texts cut to max_length lose their ends in silence (and the run's token counts
        // are of what is left): said, with how many.
        if cut > 0 && (1..=MAX_TOKENS).contains(&max_length) {
            self.warn(
                "padding.max_length",
                format!(
                    "{cut} of the {} training texts ({:.1}%) are longer than {max_length} token{} (the longest has {}): each is cut to its first {max_length}",
                    used,
                    100.0 * cut as f64 / used.max(1) as f64,
                    if max_length == 1 { "" } else { "s" },
                    train_longest
                ),
                format!("raise padding.max_length (at most {MAX_TOKENS}) to keep them whole, if the cut matters; memory grows with it"),
            );
        }
        // Labels that train nothing useful, which the run would report in silence (a
        // test accuracy of 100% for one class; a class 0 never seen).
        let trained = trained.unwrap_or_else(|| train_labels.clone());
        if let Some(test) = &test_labels {
            // Those above the training labels are said above, where they add classes.
            let above = (limit.is_none() && max_label > train_max).then_some(train_max as u32);
            self.untrained_classes(&trained, test, above);
        }
        match (trained.first(), trained.last()) {
            (Some(&only), Some(&last)) if only == last => self.one_class(&trained, "jsonl"),
            (Some(&first), Some(&last)) if first > 0 && named.is_none() => self.warn(
                "data.train",
                format!("no training label is 0: labels run from {first} to {last}, so the model gets {classes} classes and class 0 is never trained"),
                "labels are class indices from 0: subtract 1 from 1-based labels, or name the classes in labels.txt beside the file",
            ),
            _ => {}
        }
        if named.is_none() && classes > 10 && distinct.len() * 2 < classes {
            // The file the largest label is in; the labels counted are both files'.
            let (key, files) = match (max_label > train_max, test.is_some()) {
                (true, _) => ("data.test", "the training and test files"),
                (false, true) => ("data.train", "the training and test files"),
                (false, false) => ("data.train", "the training file"),
            };
            self.warn(
                key,
                format!(
                    "labels run up to {max_label}, so the model gets {classes} classes, but only {} distinct labels occur in {files}",
                    distinct.len()
                ),
                "a stray label makes every other class empty: check the data, or name the classes in labels.txt beside the file",
            );
        }
        Some(Found {
            files: Files::Jsonl { train, test, seen },
            channels: 0,
            size: 0,
            classes,
            train_total: counts[0],
            test_total: counts[1],
        })
    }

    /// A warning where a file of `key` holds the very bytes of a training file (by the
    /// size and CRC-32 the checks took as they read them): its scores are of data the
    /// model trained on, so they measure what it memorised.
    fn same_as_training(&mut self, train: &[&Path], key: &str, held: &[&Path]) {
        use crate::data::sums::recorded;
        let same = held.iter().find_map(|h| {
            let sum = recorded(h).filter(|s| s.bytes > 0)?;
            let t = train.iter().find(|t| recorded(t).as_ref() == Some(&sum))?;
            Some((*h, *t, sum))
        });
        if let Some((h, t, sum)) = same {
            let what = match key {
                "data.test" => "the test accuracy",
                _ => "validation (and so early stopping and model-best)",
            };
            self.warn(
                key,
                format!(
                    "{} {SAME_AS_TRAINING} {} ({} bytes, CRC-32 {}): {what} is measured on data the model trains on, and says what it memorised, not how it does on data it has not seen",
                    crate::recipe::lexical(h).display(),
                    crate::recipe::lexical(t).display(),
                    sum.bytes,
                    sum.crc32
                ),
                "point it at held-out data, or hold out part of the training file with data.validation = FRACTION",
            );
        }
    }

    /// The labels of the samples `used` (those the limits keep) that are trained on: less
    /// those `data.validation` holds out, as `data::load` splits them.
    fn trained_labels(&self, used: &[u32]) -> std::collections::BTreeSet<u32> {
        let held = self.held_out(used.len());
        let kept = crate::data::stratified_split(used, held, self.recipe().seed).0;
        kept.iter().map(|&k| used[k]).collect()
    }

    /// A warning where the training labels used are all one: the model learns one class.
    fn one_class(&mut self, trained: &std::collections::BTreeSet<u32>, format: &str) {
        if let (Some(&only), 1) = (trained.first(), trained.len()) {
            self.warn(
                "data.train",
                format!("every training label is {only}: the model learns one class, and its accuracy is that class's share of the test set"),
                match format {
                    "jsonl" => "check data.label_field and the file: classification needs at least two classes",
                    _ => "check the file (is it the training data, whole?): classification needs at least two classes",
                },
            );
        }
    }

    /// A warning where the test set has labels no training sample used has (but those
    /// above `said_above`, warned of already): classes the model never trains, whose test
    /// samples it is scored on.
    fn untrained_classes(
        &mut self,
        trained: &std::collections::BTreeSet<u32>,
        tested: &std::collections::BTreeSet<u32>,
        said_above: Option<u32>,
    ) {
        let untrained: Vec<u32> = tested
            .difference(trained)
            .copied()
            .filter(|&l| said_above.is_none_or(|top| l <= top))
            .collect();
        if untrained.is_empty() || trained.is_empty() {
            return;
        }
        let named = if untrained.len() > 9 { 8 } else { 9 };
        let mut shown: Vec<String> = untrained.iter().take(named).map(u32::to_string).collect();
        if untrained.len() > named {
            shown.push(format!("and {} more", untrained.len() - named));
        }
        let limited = match self.recipe().data.limit {
            Some(n) => format!(" of the first {n}"),
            None => String::new(),
        };
        self.warn(
            "data.test",
            format!(
                "label{} {} occur{} in the test set but in no training sample{limited}: the model never trains {}, and is scored on {} test samples",
                if untrained.len() == 1 { "" } else { "s" },
                shown.join(", "),
                if untrained.len() == 1 { "s" } else { "" },
                if untrained.len() == 1 { "that class" } else { "those classes" },
                if untrained.len() == 1 { "its" } else { "their" },
            ),
            match self.recipe().data.limit {
                Some(_) => "check the files' labels (does the training data hold every class?), or raise data.limit if the class is in samples past it",
                None => "check the files' labels: does the training data hold every class?",
            },
        );
    }

    /// `synthetic`: the generated set's sizes.
    fn synthetic_data(&mut self) -> Option<Found> {
        let d = &self.recipe().data;
        self.only_for("data.train", "to format = \"cifar10-bin\" or \"jsonl\"");
        self.only_for("data.test", "to format = \"cifar10-bin\" or \"jsonl\"");
        let mut s = d.synthetic.clone().unwrap_or_default();
        for (key, v, lo, hi) in [
            ("data.synthetic.samples", s.samples, 1, 10_000_000),
            ("data.synthetic.test_samples", s.test_samples, 0, 10_000_000),
            ("data.synthetic.classes", s.classes, 2, 100_000),
            ("data.synthetic.image_size", s.image_size, 1, 1024),
            ("data.synthetic.channels", s.channels, 1, 64),
        ] {
            if !(lo..=hi).contains(&v) {
                self.err(
                    key,
                    format!("{v} is out of range"),
                    format!("use {lo} to {hi}"),
                );
            }
        }
        // The checks that build on them go on with values in range: out of it they only
        // echoed the error under other keys (0 samples as "data.train: holds no training
        // samples", 1 class as model.num_classes), while a key the user set wrong
        // themselves (model.num_classes = 1) is still said.
        s.samples = s.samples.clamp(1, 10_000_000);
        s.test_samples = s.test_samples.min(10_000_000);
        s.classes = s.classes.clamp(2, 100_000);
        s.image_size = s.image_size.clamp(1, 1024);
        s.channels = s.channels.clamp(1, 64);
        Some(Found {
            files: Files::Synthetic {
                samples: s.samples,
                test_samples: s.test_samples,
            },
            channels: s.channels,
            size: s.image_size,
            classes: s.classes,
            train_total: s.samples,
            test_total: s.test_samples,
        })
    }

    /// `data.limit` and `data.validation`: (training samples, validation samples held out
    /// of them).
    fn split(&mut self, train_total: usize) -> (usize, usize) {
        let d = &self.recipe().data;
        if train_total == 0 && d.limit != Some(0) {
            self.err(
                "data.train",
                "holds no training samples",
                "point it at a file with data (blank lines are skipped)",
            );
        }
        let train_len = match d.limit {
            Some(0) => {
                self.err(
                    "data.limit",
                    "0 samples leaves nothing to train on",
                    "remove the key to use all samples",
                );
                0
            }
            Some(n) => n.min(train_total),
            None => train_total,
        };
        if d.limit.is_some_and(|n| n > train_total) {
            self.warn(
                "data.limit",
                format!("the training data has only {train_total} samples; using all of them"),
                "lower the limit or remove it",
            );
        }
        // The validation samples come out of the (limited) training set.
        let validation_len = match d.validation {
            None => 0,
            Some(f) if !(f > 0.0 && f < 1.0) => {
                self.err(
                    "data.validation",
                    format!("{f} is not a fraction between 0 and 1"),
                    "0.1 holds out a tenth of the training set",
                );
                0
            }
            Some(f) => {
                let v = (f * train_len as f64).round() as usize;
                // Refused, it holds out nothing: the other findings speak of the whole set
                // (a batch warning spoke of 1 training sample beside this one's 0).
                if train_len > 0 && (v == 0 || v >= train_len) {
                    self.err(
                        "data.validation",
                        format!(
                            "{f} of {train_len} training samples leaves {v} for validation and {} to train on",
                            train_len - v.min(train_len)
                        ),
                        "both sets need at least one sample",
                    );
                    return (train_len, 0);
                }
                v.min(train_len)
            }
        };
        (train_len - validation_len, validation_len)
    }

    /// `data.validation_file`: a validation set of its own, checked as the test set is
    /// (records, labels). Returns (validation samples, the set's files, the longest text
    /// of a JSONL file in tokens, else 0).
    fn validation_file(
        &mut self,
        format: DataFormat,
        classes: usize,
        held_out: usize,
        machine: &Machine,
    ) -> Option<(usize, Vec<PathBuf>, usize)> {
        let d = &self.recipe().data;
        let mut validation_files = vec![];
        let mut longest = 0;
        let validation_len = match (&d.validation_file, format) {
            (None, _) => held_out,
            (Some(_), _) if d.validation.is_some() => {
                self.err(
                    "data.validation_file",
                    "given with data.validation: there can be one validation set",
                    "keep the fraction of the training set, or the file",
                );
                0
            }
            (Some(_), DataFormat::Synthetic) => {
                self.only_for(
                    "data.validation_file",
                    "to format = \"cifar10-bin\" or \"jsonl\"",
                );
                0
            }
            (Some(f), DataFormat::Cifar10Bin) => {
                let files = self.cifar_files("data.validation_file", f, "")?;
                let n = self.count_records("data.validation_file", &files)?;
                // Held whole, beside the training data (which the memory check counts
                // with it): a file that alone cannot be held is refused before its labels
                // are read.
                let bytes = (n as u64).saturating_mul(cifar::PIXELS as u64);
                if !self.image_room(&[("data.validation_file", bytes)], machine) {
                    return None;
                }
                self.labels_of("data.validation_file", &files, classes, None)?;
                validation_files = files;
                n
            }
            (Some(f), DataFormat::Jsonl) => {
                let path = self.jsonl_file("data.validation_file", f)?;
                if !self.text_room(&[("data.validation_file", &path)], machine) {
                    return None;
                }
                let (tf, lf) = (
                    d.text_field.clone().unwrap_or("text".into()),
                    d.label_field.clone().unwrap_or("label".into()),
                );
                let limit = self
                    .recipe()
                    .model
                    .num_classes
                    .unwrap_or(classes)
                    .max(classes);
                let tokenizer = self.recipe().data.tokenizer.clone().unwrap_or_default();
                match crate::data::text::scan_jsonl(
                    &path,
                    &tf,
                    &lf,
                    Some(limit),
                    tokenizer.lowercase,
                ) {
                    Ok(scan) => {
                        validation_files = vec![path];
                        longest = match tokenizer.kind {
                            crate::recipe::TokenizerKind::Word => scan.longest_words,
                            crate::recipe::TokenizerKind::Byte => scan.longest_bytes,
                        };
                        scan.rows
                    }
                    Err(e) => {
                        self.data_err("data.validation_file", &e);
                        return None;
                    }
                }
            }
        };
        Some((validation_len, validation_files, longest))
    }

    /// `data.normalize`: one value per channel (a single value is used for all).
    fn normalize(&mut self, channels: usize) -> Normalize {
        // No table is the table's defaults: pixels scaled to 0..1, on the host.
        let n = self.recipe().data.normalize.clone().unwrap_or_default();
        let mut widen = |key: &str, v: &[f32]| -> Vec<f32> {
            if v.len() == 1 {
                vec![v[0]; channels]
            } else if v.len() == channels {
                v.to_vec()
            } else {
                self.err(
                    key,
                    format!("{} values for {channels} channels", v.len()),
                    format!("give one value, or one per channel ({channels})"),
                );
                vec![1.0; channels]
            }
        };
        let mean = widen("data.normalize.mean", &n.mean);
        let std = widen("data.normalize.std", &n.std);
        if std.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
            self.err(
                "data.normalize.std",
                "every std must be a positive number",
                "pixels are divided by it",
            );
        }
        if mean.iter().any(|m| !m.is_finite()) {
            self.err(
                "data.normalize.mean",
                "every mean must be a finite number",
                "means are of pixels in 0..1",
            );
        }
        Normalize {
            mean,
            std,
            on: n.on,
        }
    }

    pub(super) fn jsonl_file(&mut self, key: &str, rel: &str) -> Option<PathBuf> {
        let path = self.path_of(key, rel)?;
        if path.is_file() {
            Some(path)
        } else {
            let what = match path.is_dir() {
                true => "is a directory, not a .jsonl file",
                false => "is not a regular file",
            };
            self.not_a_file(key, rel, &path, what, "name a .jsonl file");
            None
        }
    }

    /// A data path that is missing, or is something the format cannot read (`written` as
    /// the recipe writes it).
    fn not_a_file(&mut self, key: &str, written: &str, path: &Path, what: &str, help: &str) {
        let shown = crate::recipe::lexical(path);
        if path.exists() {
            self.err(key, format!("{} {what}", shown.display()), help);
        } else {
            let why = crate::recipe::why_missing(path);
            let help = if why == "does not exist" && self.l.set_on_command_line(key) {
                "--set paths are relative to the working directory; the shipped data is under datasets/"
            } else if why == "does not exist"
                && (Path::new(written).is_absolute() || written.starts_with('~'))
            {
                // (A run's own recipe.toml, which names its data by absolute path, in a
                // copy of the run on another machine or clone, was told of relative paths.)
                "the file is not at that path on this machine: put it there, or point the key at where it is"
            } else if why == "does not exist" {
                "paths are relative to the recipe file; the shipped data is under datasets/"
            } else {
                "check the path, its links and the permissions of the folders on the way"
            };
            self.err(key, format!("{} {why}", shown.display()), help);
        }
    }

    /// Text keys on image data, image keys on text data.
    fn kind_keys(&mut self, text: bool) {
        if !text {
            for k in ["data.text_field", "data.label_field", "data.tokenizer"] {
                self.only_for(k, "to text data (format = \"jsonl\")");
            }
            if self.l.is_set("padding") {
                self.err(
                    "padding",
                    "applies to text data (format = \"jsonl\"); images all have one size",
                    "remove the [padding] table",
                );
            }
            return;
        }
        for k in ["data.normalize", "data.augment"] {
            self.only_for(k, "to image data");
        }
    }

    /// Texts with nothing for the tokenizer (empty, or white space only to the word
    /// tokenizer): each is one unknown token, all alike to the model. Said, with how many
    /// (they trained, or were scored, without a word).
    fn texts_without_tokens(
        &mut self,
        key: &str,
        path: &Path,
        scan: &crate::data::text::Scan,
        kind: crate::recipe::TokenizerKind,
        used: usize,
    ) {
        let (none, what) = match kind {
            crate::recipe::TokenizerKind::Word => {
                (&scan.no_words, "no word (empty, or only white space)")
            }
            crate::recipe::TokenizerKind::Byte => (&scan.no_bytes, "no byte (empty)"),
        };
        let used = used.min(scan.rows);
        let none: Vec<usize> = none.iter().copied().filter(|&i| i < used).collect();
        let Some(&first) = none.first() else { return };
        let file = crate::recipe::lexical(path);
        let rows = match used < scan.rows {
            true => format!("first {used}"),
            false => used.to_string(),
        };
        let message = if none.len() == used {
            match used < scan.rows {
                true => format!(
                    "each of the first {used} texts of {} has {what}",
                    file.display()
                ),
                false => format!("every text of {} has {what}", file.display()),
            }
        } else {
            format!(
                "{} of the {rows} texts of {} have {what}, the first being text {} (blank lines not counted)",
                none.len(),
                file.display(),
                first + 1
            )
        };
        self.warn(
            key,
            format!("{message}: each is one unknown token, so the model tells none of them apart"),
            "check data.text_field, or leave such lines out of the file",
        );
    }

    /// How many of the `used` training samples `data.validation` (a fraction) holds out:
    /// as `split` counts them, 0 where it refuses the fraction or a file of its own is named.
    fn held_out(&self, used: usize) -> usize {
        let d = &self.recipe().data;
        match d.validation {
            Some(f) if f > 0.0 && f < 1.0 && d.validation_file.is_none() => {
                let v = (f * used as f64).round() as usize;
                if v < used {
                    v
                } else {
                    0
                }
            }
            _ => 0,
        }
    }

    /// A `min_freq` above every training word's count keeps no word: every text is then
    /// unknown tokens, and the run trained on nothing, in silence.
    fn vocabulary_left(&mut self, top_word_count: usize, t: &crate::recipe::TokenizerSection) {
        if t.kind == crate::recipe::TokenizerKind::Word
            && top_word_count > 0
            && t.min_freq > top_word_count
        {
            self.warn(
                "data.tokenizer.min_freq",
                format!(
                    "{} is more than any training word occurs (the most frequent, {}): the vocabulary holds no word, and every text is unknown tokens",
                    t.min_freq,
                    match top_word_count {
                        1 => "once".to_string(),
                        n => format!("{n} times"),
                    }
                ),
                format!("use at most {top_word_count} (1 or 2 is usual)"),
            );
        }
    }

    /// The text plan: fields, tokenizer and padding.
    fn text_plan(&mut self, seen: TextSeen) -> TextPlan {
        let r = self.recipe();
        let p = r.padding.clone().unwrap_or_default();
        let t = r.data.tokenizer.clone().unwrap_or_default();
        if p.max_length > MAX_TOKENS {
            self.err(
                "padding.max_length",
                format!("{} tokens, over the cap of {MAX_TOKENS}", p.max_length),
                "sequences are cut to this length; 512 is usual",
            );
        }
        if p.max_length == 0 {
            self.err(
                "padding.max_length",
                "0 tokens",
                "sequences are cut to this length; use at least 1",
            );
        }
        if p.multiple_of == 0 {
            self.err(
                "padding.multiple_of",
                "0 cannot be a multiple",
                "use 1 for no rounding, or e.g. 8",
            );
        }
        // Rows are rounded up to the multiple: one past the longest row pads every row to
        // it (100,000 tokens for rows cut to 64 trained at 1.3 s a step, or aborted).
        if p.multiple_of > p.max_length.max(1) && p.max_length > 0 {
            self.err(
                "padding.multiple_of",
                format!(
                    "{} is more than padding.max_length ({}): every row would be padded to {} tokens",
                    p.multiple_of, p.max_length, p.multiple_of
                ),
                "use a small multiple (8 suits tensor cores), at most max_length",
            );
        }
        if p.strategy != crate::recipe::PaddingStrategy::Bucket {
            self.only_for("padding.buckets", "to strategy = \"bucket\"");
        } else if p.buckets == Some(0) {
            self.err(
                "padding.buckets",
                "0 buckets",
                "use at least 1 (8 is usual)",
            );
        }
        if t.kind == crate::recipe::TokenizerKind::Word && t.max_vocab == 0 {
            self.err(
                "data.tokenizer.max_vocab",
                "an empty vocabulary",
                "use e.g. 20000",
            );
        }
        if t.kind == crate::recipe::TokenizerKind::Byte {
            self.only_for("data.tokenizer.max_vocab", "to kind = \"word\"");
            self.only_for("data.tokenizer.min_freq", "to kind = \"word\"");
        }
        if p.pad_id > 1_000_000 {
            self.err(
                "padding.pad_id",
                format!("{} would need an embedding table that large", p.pad_id),
                "use a small id; 0 is usual",
            );
        } else {
            // Past the vocabulary's ids the embedding table grows to hold it, the rows
            // between unused (1,000,000 made a 4,611-parameter model one of 64 million,
            // and its steps 4,000 times slower).
            let ids = match t.kind {
                crate::recipe::TokenizerKind::Word => seen.words + 2,
                crate::recipe::TokenizerKind::Byte => 258,
            };
            let pad = p.pad_id as usize;
            // Ids run 0..ids: one at `ids` is past them too (one row never used).
            if pad >= ids {
                self.warn(
                    "padding.pad_id",
                    format!(
                        "{pad} is past the vocabulary's {ids} ids: the embedding table grows to {} rows to hold it, {} of them never used",
                        pad + 1,
                        pad + 1 - ids
                    ),
                    "use 0 (the usual): the tokenizer leaves the padding id free wherever it is",
                );
            }
        }
        TextPlan {
            text_field: r.data.text_field.clone().unwrap_or("text".into()),
            label_field: r.data.label_field.clone().unwrap_or("label".into()),
            tokenizer: t,
            padding: crate::data::pad::Padding {
                strategy: p.strategy,
                max_length: p.max_length.max(1),
                multiple_of: p.multiple_of.max(1),
                pad_id: p.pad_id,
            },
            buckets: p.buckets.unwrap_or(DEFAULT_BUCKETS).max(1),
            seen,
        }
    }

    /// A `.bin` file, or a directory: its `<stem>*.bin` files in name order.
    pub(super) fn cifar_files(&mut self, key: &str, rel: &str, stem: &str) -> Option<Vec<PathBuf>> {
        let path = self.path_of(key, rel)?;
        if path.is_dir() {
            let entries = match std::fs::read_dir(&path) {
                Ok(entries) => entries,
                Err(e) => {
                    self.err(
                        key,
                        format!(
                            "directory {} cannot be listed: {e}",
                            crate::recipe::lexical(&path).display()
                        ),
                        "check its permissions (listing needs read and execute), or name one .bin file",
                    );
                    return None;
                }
            };
            // A name that is not UTF-8 is matched too (it was left out in silence, and its
            // samples with it).
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .map(|n| n.to_string_lossy())
                        .is_some_and(|n| n.starts_with(stem) && n.ends_with(".bin"))
                })
                .collect();
            // In natural order, numbers by their value: `data_batch_10` after
            // `data_batch_2` (by bytes it came first, and `data.limit` took its samples).
            files.sort_by_cached_key(|p| {
                natural_key(&p.file_name().unwrap_or_default().to_string_lossy())
            });
            if files.is_empty() {
                self.err(
                    key,
                    format!("directory {} holds no {stem}*.bin file", path.display()),
                    "point at the cifar-10-batches-bin directory or at one .bin file",
                );
                return None;
            }
            Some(files)
        } else if path.is_file() {
            Some(vec![path])
        } else {
            self.not_a_file(
                key,
                rel,
                &path,
                "is neither a regular file nor a directory",
                "name a .bin file or the directory holding them",
            );
            None
        }
    }

    pub(super) fn count_records(&mut self, key: &str, files: &[PathBuf]) -> Option<usize> {
        let mut n = 0;
        for f in files {
            match cifar::count_records(f) {
                Ok(k) => n += k,
                Err(e) => {
                    self.data_err(key, &e);
                    return None;
                }
            }
        }
        Some(n)
    }
}

/// A file name's sort key in natural order: runs of digits compared by their value (then
/// by their length: `01` after `1`), the rest by its chars.
fn natural_key(name: &str) -> Vec<(bool, String)> {
    let mut key = vec![];
    let mut chars = name.chars().peekable();
    while let Some(&c) = chars.peek() {
        let digits = c.is_ascii_digit();
        let mut part = String::new();
        while let Some(&c) = chars.peek().filter(|c| c.is_ascii_digit() == digits) {
            part.push(c);
            chars.next();
        }
        if digits {
            // Left-padded to one width, so that strings compare as numbers; a run longer
            // than the pad (no file has one) compares by its length first.
            let trimmed = part.trim_start_matches('0');
            part = format!("{:0>40}{:0>4}", trimmed, part.len());
        }
        key.push((digits, part));
    }
    key
}

#[cfg(test)]
mod tests {
    use super::natural_key;

    #[test]
    fn batches_sort_by_their_numbers() {
        let mut names = [
            "data_batch_10.bin",
            "data_batch_2.bin",
            "data_batch_1.bin",
            "data_batch.bin",
            "data_batch_x.bin",
            "data_batch_02.bin",
        ];
        names.sort_by_key(|n| natural_key(n));
        assert_eq!(
            names,
            [
                "data_batch.bin",
                "data_batch_1.bin",
                "data_batch_2.bin",
                "data_batch_02.bin",
                "data_batch_10.bin",
                "data_batch_x.bin",
            ]
        );
    }
}
