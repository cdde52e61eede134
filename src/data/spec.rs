//! What validation decided about the data, in the form the loaders read: the sources,
//! the image shape or the text plan, the sample counts (training, test, validation),
//! normalisation and augmentation. Owned here so `data` depends on no other layer;
//! `plan` builds these (and re-exports them).

use std::path::PathBuf;

use crate::recipe::NormalizeOn;

#[derive(Debug, Clone, PartialEq)]
pub enum DataSource {
    /// CIFAR-10 binary files, read in the order given.
    Cifar {
        train: Vec<PathBuf>,
        test: Vec<PathBuf>,
    },
    /// Text, one JSON object per line.
    Jsonl {
        train: PathBuf,
        test: Option<PathBuf>,
    },
    Synthetic {
        samples: usize,
        test_samples: usize,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct DataPlan {
    pub source: DataSource,
    /// Image shape, channels × height × width.
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    pub classes: usize,
    /// Training samples used (after `limit`, without the validation samples).
    pub train_len: usize,
    pub test_len: usize,
    /// Validation samples: held out of the training set (`data.validation`), or read from
    /// `validation_files`; 0: none.
    pub validation_len: usize,
    /// `data.validation_file`: the validation set's own files (then nothing is held out).
    pub validation_files: Vec<PathBuf>,
    /// Per-channel mean and std (one per channel) and where they are applied.
    pub normalize: Normalize,
    pub crop_padding: usize,
    pub hflip: bool,
    /// Text data: fields, tokenizer and padding.
    pub text: Option<TextPlan>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TextPlan {
    pub text_field: String,
    pub label_field: String,
    pub tokenizer: crate::recipe::TokenizerSection,
    pub padding: crate::data::pad::Padding,
    /// `bucket`: the number of length buckets.
    pub buckets: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Normalize {
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
    pub on: NormalizeOn,
}
