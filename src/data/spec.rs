//! What validation decided about the data, in the form the loaders read: the sources with
//! the image shape and preparation (normalisation, augmentation) or the text plan, and the
//! sample counts (training, test, validation). Owned here so `data` depends on no other layer;
//! `plan` builds these (and re-exports them).

use std::path::PathBuf;

use crate::recipe::NormalizeOn;

/// Where samples come from, with what a sample is: images (with their shape and
/// preparation) or token sequences (with fields, tokenizer and padding). One enum, so a
/// plan cannot pair text files with image preparation.
#[derive(Debug, Clone, PartialEq)]
pub enum DataSource {
    /// CIFAR-10 binary files, read in the order given.
    Cifar {
        train: Vec<PathBuf>,
        test: Vec<PathBuf>,
        image: ImagePlan,
    },
    Synthetic {
        samples: usize,
        test_samples: usize,
        image: ImagePlan,
    },
    /// Text, one JSON object per line.
    Jsonl {
        train: PathBuf,
        test: Option<PathBuf>,
        text: TextPlan,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct DataPlan {
    pub source: DataSource,
    pub classes: usize,
    /// Training samples used (after `limit`, without the validation samples).
    pub train_len: usize,
    pub test_len: usize,
    /// Validation samples: held out of the training set (`data.validation`), or read from
    /// `validation_files`; 0: none.
    pub validation_len: usize,
    /// `data.validation_file`: the validation set's own files (then nothing is held out).
    pub validation_files: Vec<PathBuf>,
}

impl DataPlan {
    /// The files the data is read from: training, test, then validation.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut out = match &self.source {
            DataSource::Cifar { train, test, .. } => [train.clone(), test.clone()].concat(),
            DataSource::Synthetic { .. } => vec![],
            DataSource::Jsonl { train, test, .. } => {
                std::iter::once(train.clone()).chain(test.clone()).collect()
            }
        };
        out.extend(self.validation_files.iter().cloned());
        out
    }

    /// Image data's shape and preparation.
    pub fn image(&self) -> Option<&ImagePlan> {
        match &self.source {
            DataSource::Cifar { image, .. } | DataSource::Synthetic { image, .. } => Some(image),
            DataSource::Jsonl { .. } => None,
        }
    }

    /// Text data's fields, tokenizer and padding.
    pub fn text(&self) -> Option<&TextPlan> {
        match &self.source {
            DataSource::Jsonl { text, .. } => Some(text),
            _ => None,
        }
    }

    /// The test set's files (none for synthetic data).
    pub fn test_files(&self) -> Vec<PathBuf> {
        match &self.source {
            DataSource::Cifar { test, .. } => test.clone(),
            DataSource::Jsonl { test, .. } => test.iter().cloned().collect(),
            DataSource::Synthetic { .. } => vec![],
        }
    }
}

/// Images: `channels × height × width` bytes a sample, and how they are prepared.
#[derive(Debug, Clone, PartialEq)]
pub struct ImagePlan {
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    /// Per-channel mean and std (one per channel) and where they are applied.
    pub normalize: Normalize,
    pub crop_padding: usize,
    pub hflip: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TextPlan {
    pub text_field: String,
    pub label_field: String,
    pub tokenizer: crate::recipe::TokenizerSection,
    pub padding: crate::data::pad::Padding,
    /// `bucket`: the number of length buckets.
    pub buckets: usize,
    /// What validation read of the files, for the memory pre-flight.
    pub seen: TextSeen,
}

/// The longest text of the training, test and validation files in tokens (before the cut to
/// `max_length`), and the words a word vocabulary built from the training texts keeps
/// (`min_freq`, `max_vocab`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TextSeen {
    pub longest: usize,
    pub words: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Normalize {
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
    pub on: NormalizeOn,
}
