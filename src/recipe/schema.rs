//! The recipe format, v1: one serde struct per TOML table, mirroring what the user typed.
//!
//! Every table denies unknown keys and every key has a default, so a table that names only
//! some keys deserializes. Each field is documented once, here, with its default and unit;
//! README.md repeats the table for users and a test checks that it names every key.
//! Nothing here checks rules across keys or touches files: that is `plan`'s work.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A whole recipe file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Recipe {
    /// Run name; the run directory is `<log.dir>/<name>/<run-id>`. Default: the file stem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Free text saying what the recipe measures. Default: empty.
    pub description: String,
    /// Seed for model initialisation, shuffling, augmentation and synthetic data. Default 0.
    pub seed: u64,
    pub backend: BackendSection,
    pub model: ModelSection,
    pub data: DataSection,
    pub loader: LoaderSection,
    pub optim: OptimSection,
    pub cleanup: CleanupSection,
    pub run: RunSection,
    pub log: LogSection,
    pub profile: ProfileSection,
    pub slurm: SlurmSection,
    pub checkpoint: CheckpointSection,
    /// Text data only; see `PaddingSection`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub padding: Option<PaddingSection>,
}

/// `[backend]`: where the run executes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BackendSection {
    /// `auto` (CUDA when compiled in and a GPU answers, else CPU), `cpu`, `cuda`, or
    /// `wgpu` (Burn's WebGPU backend on Vulkan, in a binary built with `--features wgpu`;
    /// experimental: the tests run it on Mesa's software Vulkan to exercise the CubeCL
    /// code CUDA runs). Default `auto`.
    pub kind: BackendKind,
    /// Which device: the CUDA device index, or for `wgpu` the adapter's index in the list
    /// an out-of-range index prints (discrete GPUs first, software adapters last). Default
    /// 0. Ignored by the CPU backend.
    pub device: usize,
    /// Threads for the CPU backend's kernels (rayon). Default 0 = one per core.
    pub threads: usize,
    /// CUDA: how hard CubeCL's autotuner searches for the fastest matmul and convolution
    /// kernel of each new shape: `minimal`, `balanced`, `extensive` or `full`. Results are
    /// cached (see `cache_dir`), so only the first run of a shape on a machine pays.
    /// Default `balanced` (CubeCL's own default). Ignored by the CPU backend.
    pub autotune: AutotuneLevel,
    /// CUDA and WebGPU: Burn's kernel fusion (element-wise chains compiled into one
    /// kernel): `true`, `false` or `"auto"`. Fusion adds a third thread that waits for work
    /// by spinning on a CPU core (CubeCL's device thread and the training loop's are the
    /// other two), so it needs 3 cores to itself: on 2, a warm ResNet-50 step's host side
    /// took 260 ms with fusion and 21 ms without (BENCHMARKS.md). `"auto"`: fusion when
    /// this process may use at least 4 CPUs (its affinity and cgroup quota, as a Slurm
    /// task's `--cpus-per-task`), none below; the choice and its reason go into env.json.
    /// Default `"auto"`. Ignored by the CPU backend.
    pub fusion: Fusion,
    /// CUDA: how a convolution picks its kernel. `implicit_gemm`: one implicit-GEMM kernel
    /// on TF32 tensor cores per pass, untuned, so a cold first step compiles a fraction of
    /// the kernels (a strided convolution's input gradient takes Burn's transposed
    /// convolution, tuned between two kernels; a shape the GEMM refuses goes to
    /// `autotune`). `autotune`: each new shape tries Burn's candidates (8 for the forward
    /// pass, 6 and 7 for the two gradients), each compiled and timed, and keeps the
    /// fastest. Default `implicit_gemm`: on an H200, ResNet-50's first step came 171 s
    /// after a cold start with it, and had not come after 520 s with `autotune`. Ignored
    /// by the CPU backend (its convolution is the runner's own).
    pub conv: ConvAlgo,
    /// CUDA, with `conv = "implicit_gemm"`: which of CubeCL's implicit-GEMM convolution
    /// kernels runs every pass, by its name in CubeCL:
    /// `simple_sync_cyclic` (Burn's own choice), `simple_sync_strided`,
    /// `simple_sync_tilewise`, `simple_async_cyclic`, `simple_async_strided`,
    /// `simple_async_tma`, `specialized_async_cyclic`, `specialized_async_strided` or
    /// `specialized_tma` (`tma`: loads by the Tensor Memory Accelerator, Hopper and later;
    /// `async`: loads overlap the math; `specialized`: load and compute warps apart). A pass
    /// the kernel refuses (CubeCL has no TMA input gradient) takes `simple_sync_cyclic`,
    /// and a shape that refuses too takes `autotune`; the first refusal of each kind is said
    /// on stderr. Default `simple_sync_cyclic`.
    pub conv_kernel: ConvKernel,
    /// CUDA, with `conv = "implicit_gemm"`: the tensor-core instruction of `conv_kernel`:
    /// `cmma` (warp-wide matrix fragments, Burn's own choice) or `mma` (PTX `mma.sync`
    /// tiles). Default `cmma`.
    pub conv_tile: ConvTile,
    /// CUDA, with `conv = "implicit_gemm"`: the weight gradient of a convolution whose
    /// weight is too small to keep the GPU busy. Its GEMM has the weight's shape as output
    /// (out channels × in channels · kernel area) and the batch's pixels as depth, so
    /// CubeCL's kernel, which makes one 64×64 block of the output per cube, runs a few
    /// cubes for the whole batch (9 on ResNet-50's first 3×3 at batch 64, on an H200's 132
    /// multiprocessors). `auto`: such a gradient is computed as a batched matmul over `S`
    /// slices of the batch's pixels (about two cubes per multiprocessor; each slice at
    /// least 256 pixels), then summed over the slices. `off`: CubeCL's implicit GEMM takes
    /// every weight gradient. Default `auto`.
    pub conv_split: ConvSplit,
    /// CUDA: how a training batch norm sums what it needs per channel. `one_pass`: a
    /// kernel of the runner's own reads the activation once for both forward sums (of
    /// the values and of their squares, shifted by each channel's first value) and once
    /// for both backward sums (of the output gradient and of its product with the
    /// centred input), and finishes the statistics, in 2 launches each way, where Burn's
    /// reductions take 4 launches and two reads each way, and small ops to finish.
    /// `one_pass` also gives the rest of the batch norm to kernels of the runner's: the
    /// normalisation with its residual and ReLU (one launch where Burn's ops take about
    /// nine unfused; fused, fusion left four of them op by op, one a full pass), its
    /// input gradient (one where they take about fourteen unfused), the running
    /// statistics' update (one where they take seven); with fusion on, each is a custom
    /// operation in fusion's stream. `reduce`: Burn's reductions and ops (the form
    /// before the kernels), which fusion joins where it is on. Default `one_pass`. Ignored by the CPU backend (its batch
    /// norm is the runner's own).
    pub norm_sums: NormSums,
    /// CUDA: the products of the models' layers, forward and for both gradients: every
    /// fully connected layer (the classifier heads, the MLP's and the bag model's layers,
    /// the Transformer's, the LSTM's gates) and the Transformer's attention (its two
    /// batched products). `fixed`: one kernel chosen by the shape, untuned, as Burn
    /// chooses when built without autotune (CubeCL's tensor-core matmul, its unit kernel
    /// where that refuses). `autotune`: Burn's matmul, which compiles and times about ten
    /// candidate kernels for each new shape (a layer has three) and keeps the fastest.
    /// Default `fixed`: behind the stand-in driver (NVRTC as on the GPU machine, 2 CPUs;
    /// BENCHMARKS.md) a cold first step of ResNet-50 compiled 145 kernels and was done
    /// after 10.8 s, where `autotune` compiled 176 in 27.2 s (without fusion: 100 in
    /// 8.7 s against 157 in 54.6 s); the MLP's, 54 in 3.4 s against 95 in 17.6 s; the
    /// Transformer recipe's, 244 in 11.0 s against 496 in 118.5 s. Which is faster per
    /// step on a GPU is not measured yet. Ignored by the CPU backend (Burn's matmul there
    /// tunes nothing).
    pub matmul: MatmulAlgo,
    /// Where compiled kernels and autotune results are kept between runs (relative to
    /// this file). Default: `$RUNNER_CACHE_DIR`, else `$XDG_CACHE_HOME/runner`, else
    /// `~/.cache/runner`. Safe to share between concurrent runs (a Slurm array).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_dir: Option<String>,
}

impl Default for BackendSection {
    fn default() -> Self {
        Self {
            kind: BackendKind::Auto,
            device: 0,
            threads: 0,
            autotune: AutotuneLevel::Balanced,
            fusion: Fusion::Auto,
            conv: ConvAlgo::ImplicitGemm,
            conv_kernel: ConvKernel::SimpleSyncCyclic,
            conv_tile: ConvTile::Cmma,
            conv_split: ConvSplit::Auto,
            norm_sums: NormSums::OnePass,
            matmul: MatmulAlgo::Fixed,
            cache_dir: None,
        }
    }
}

/// `backend.fusion`: `true`, `false` or `"auto"` (by the CPUs this process may use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fusion {
    Auto,
    On,
    Off,
}

impl Fusion {
    /// The fewest CPUs `"auto"` turns fusion on with: one core for each of the three
    /// threads that spin while they wait (the training loop's, fusion's and CubeCL's device
    /// thread), and one for the loader and everything else.
    pub const AUTO_MIN_CPUS: usize = 4;
}

impl JsonSchema for Fusion {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Fusion".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "true, false or \"auto\" (fusion when the process may use at least 4 CPUs)",
            "oneOf": [
                { "type": "boolean" },
                { "type": "string", "enum": ["auto"] }
            ]
        })
    }
}

impl Serialize for Fusion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Fusion::Auto => s.serialize_str("auto"),
            Fusion::On => s.serialize_bool(true),
            Fusion::Off => s.serialize_bool(false),
        }
    }
}

impl<'de> Deserialize<'de> for Fusion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Fusion;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("true, false or \"auto\"")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Fusion, E> {
                Ok(if v { Fusion::On } else { Fusion::Off })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Fusion, E> {
                match v {
                    "auto" => Ok(Fusion::Auto),
                    other => Err(E::invalid_value(serde::de::Unexpected::Str(other), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// CubeCL's autotune levels, least to most effort.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AutotuneLevel {
    Minimal,
    Balanced,
    Extensive,
    Full,
}

impl AutotuneLevel {
    pub fn name(self) -> &'static str {
        match self {
            Self::Minimal => "minimal",
            Self::Balanced => "balanced",
            Self::Extensive => "extensive",
            Self::Full => "full",
        }
    }
}

/// How CUDA convolutions pick their kernels (`backend.conv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConvAlgo {
    Autotune,
    ImplicitGemm,
}

impl ConvAlgo {
    pub fn name(self) -> &'static str {
        match self {
            Self::Autotune => "autotune",
            Self::ImplicitGemm => "implicit_gemm",
        }
    }
}

/// CubeCL's implicit-GEMM convolution kernels (`backend.conv_kernel`), named as CubeCL
/// names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConvKernel {
    SimpleSyncCyclic,
    SimpleSyncStrided,
    SimpleSyncTilewise,
    SimpleAsyncCyclic,
    SimpleAsyncStrided,
    SimpleAsyncTma,
    SpecializedAsyncCyclic,
    SpecializedAsyncStrided,
    SpecializedTma,
}

impl ConvKernel {
    pub const ALL: [ConvKernel; 9] = [
        Self::SimpleSyncCyclic,
        Self::SimpleSyncStrided,
        Self::SimpleSyncTilewise,
        Self::SimpleAsyncCyclic,
        Self::SimpleAsyncStrided,
        Self::SimpleAsyncTma,
        Self::SpecializedAsyncCyclic,
        Self::SpecializedAsyncStrided,
        Self::SpecializedTma,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::SimpleSyncCyclic => "simple_sync_cyclic",
            Self::SimpleSyncStrided => "simple_sync_strided",
            Self::SimpleSyncTilewise => "simple_sync_tilewise",
            Self::SimpleAsyncCyclic => "simple_async_cyclic",
            Self::SimpleAsyncStrided => "simple_async_strided",
            Self::SimpleAsyncTma => "simple_async_tma",
            Self::SpecializedAsyncCyclic => "specialized_async_cyclic",
            Self::SpecializedAsyncStrided => "specialized_async_strided",
            Self::SpecializedTma => "specialized_tma",
        }
    }
}

/// The tensor-core instruction of an implicit-GEMM convolution (`backend.conv_tile`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConvTile {
    Cmma,
    Mma,
}

impl ConvTile {
    pub fn name(self) -> &'static str {
        match self {
            Self::Cmma => "cmma",
            Self::Mma => "mma",
        }
    }
}

/// Whether a convolution's weight gradient may be split over the batch
/// (`backend.conv_split`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConvSplit {
    Auto,
    Off,
}

impl ConvSplit {
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Off => "off",
        }
    }
}

/// How the models' layers' products pick their kernel on CUDA (`backend.matmul`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MatmulAlgo {
    Fixed,
    Autotune,
}

impl MatmulAlgo {
    pub fn name(self) -> &'static str {
        match self {
            Self::Fixed => "fixed",
            Self::Autotune => "autotune",
        }
    }
}

/// Where a batch norm's per-channel sums come from on CUDA (`backend.norm_sums`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NormSums {
    OnePass,
    Reduce,
}

impl NormSums {
    pub fn name(self) -> &'static str {
        match self {
            Self::OnePass => "one_pass",
            Self::Reduce => "reduce",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    Auto,
    Cpu,
    Cuda,
    Wgpu,
}

/// `[model]`: the network.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// Images: `resnet18`, `resnet34`, `resnet50`, `small_cnn` or `mlp`; text: `bag`
    /// (mean of embeddings, fastText style), `lstm` or `transformer`. Required.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arch: Option<Arch>,
    /// ResNet stem: `cifar` (3×3 stride-1 conv, no max-pool) or `imagenet` (7×7 stride-2
    /// conv + 3×3 stride-2 max-pool). Default `cifar`. ResNets only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stem: Option<Stem>,
    /// Output classes. Default: the dataset's class count.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2))]
    pub num_classes: Option<usize>,
    /// `small_cnn` only: channels of the first conv block (doubled in the second). Default 32.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub width: Option<usize>,
    /// `mlp` and `bag`: sizes of the hidden layers. Default `[256]` (mlp), `[]` (bag).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden: Option<Vec<usize>>,
    /// Text models: size of the token embeddings (the Transformer's model width). Default 64.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 8192))]
    pub embed_dim: Option<usize>,
    /// `lstm`: hidden state size. Default 128.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 8192))]
    pub hidden_size: Option<usize>,
    /// `lstm` and `transformer`: stacked layers. Default 1 (lstm), 2 (transformer).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub layers: Option<usize>,
    /// `transformer`: attention heads (must divide `embed_dim`). Default 4.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub heads: Option<usize>,
    /// `transformer`: feed-forward width. Default 4 × `embed_dim`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65536))]
    pub ff_dim: Option<usize>,
    /// `transformer`: dropout in training. Default 0.1.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0), extend("exclusiveMaximum" = 1.0))]
    pub dropout: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    Resnet18,
    Resnet34,
    Resnet50,
    SmallCnn,
    Mlp,
    Bag,
    Lstm,
    Transformer,
}

impl Arch {
    pub const ALL: [Arch; 8] = [
        Arch::Resnet18,
        Arch::Resnet34,
        Arch::Resnet50,
        Arch::SmallCnn,
        Arch::Mlp,
        Arch::Bag,
        Arch::Lstm,
        Arch::Transformer,
    ];

    /// As a recipe writes it.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Resnet18 => "resnet18",
            Arch::Resnet34 => "resnet34",
            Arch::Resnet50 => "resnet50",
            Arch::SmallCnn => "small_cnn",
            Arch::Mlp => "mlp",
            Arch::Bag => "bag",
            Arch::Lstm => "lstm",
            Arch::Transformer => "transformer",
        }
    }

    /// One line for `runner ls`.
    pub fn about(self) -> &'static str {
        match self {
            Arch::Resnet18 => "images: ResNet-18, BasicBlock [2,2,2,2]; 11,173,962 parameters with the CIFAR stem and 10 classes",
            Arch::Resnet34 => "images: ResNet-34, BasicBlock [3,4,6,3]; 21,282,122 parameters (CIFAR stem, 10 classes)",
            Arch::Resnet50 => "images: ResNet-50, Bottleneck [3,4,6,3]; 23,520,842 parameters (CIFAR stem, 10 classes)",
            Arch::SmallCnn => "images: two conv-BN-ReLU-pool blocks and a two-layer head, for quick CPU runs",
            Arch::Mlp => "images: fully connected layers (model.hidden)",
            Arch::Bag => "text: mean of the token embeddings (fastText style), then model.hidden layers",
            Arch::Lstm => "text: stacked LSTMs, classified from the hidden state at the last real token",
            Arch::Transformer => "text: a pre-norm Transformer encoder with a key padding mask, mean over real positions",
        }
    }

    pub fn is_resnet(self) -> bool {
        matches!(self, Arch::Resnet18 | Arch::Resnet34 | Arch::Resnet50)
    }
    /// Reads token sequences rather than images.
    pub fn is_text(self) -> bool {
        matches!(self, Arch::Bag | Arch::Lstm | Arch::Transformer)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Stem {
    Cifar,
    Imagenet,
}

/// `[data]`: where samples come from and how they are prepared.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DataSection {
    /// `cifar10-bin` (CIFAR-10 binary records), `synthetic` (generated images) or `jsonl`
    /// (text: one JSON object per line). Required.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<DataFormat>,
    /// Training data, relative to the recipe file: `cifar10-bin`, a `.bin` file or a
    /// directory holding `data_batch*.bin` (read in natural order: `data_batch_2` before
    /// `data_batch_10`); `jsonl`, a `.jsonl` file. Required for both.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train: Option<String>,
    /// Test data, relative to the recipe file: a `.bin` file or a directory holding
    /// `test_batch.bin`; a `.jsonl` file. Default: none (no evaluation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test: Option<String>,
    /// Use only the first N training samples. Default: all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// Use only the first N test samples. Default: all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_limit: Option<usize>,
    /// Hold out this fraction of the (limited) training set as a validation set: a
    /// deterministic, class-stratified split by the seed; the model never trains on it.
    /// It is evaluated every `run.validate` and drives `run.early_stop` and
    /// `model-best.safetensors`. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(extend("exclusiveMinimum" = 0.0, "exclusiveMaximum" = 1.0))]
    pub validation: Option<f64>,
    /// A validation set of its own instead: a file (or, for `cifar10-bin`, a directory of
    /// `.bin` files) in the data's format, relative to the recipe. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validation_file: Option<String>,
    /// Per-channel normalisation `(x/255 - mean) / std`. Default: none (pixels scaled to 0..1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normalize: Option<NormalizeSection>,
    /// Training-time augmentation (image data only). Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub augment: Option<AugmentSection>,
    /// `synthetic` only: the generated data set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub synthetic: Option<SyntheticSection>,
    /// `jsonl`: the field holding the text. Default `"text"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text_field: Option<String>,
    /// `jsonl`: the field holding the integer label. Default `"label"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label_field: Option<String>,
    /// `jsonl`: how text becomes token ids.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<TokenizerSection>,
}

// Written out (a resolved recipe) with `max_vocab` and `min_freq` only for `word`, the
// only kind they apply to, so a byte cell of a grid over `kind` runs on its own.
/// `[data.tokenizer]`: built from the training split and saved in the run directory.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TokenizerSection {
    /// `word` (a vocabulary of the training split's words; letters and digits form words,
    /// every other non-space character is a token of its own) or `byte` (UTF-8 bytes, no
    /// vocabulary to build). Default `word`.
    pub kind: TokenizerKind,
    /// `word`: the most frequent words kept (ties by first appearance). Default 20000.
    #[schemars(range(min = 1))]
    pub max_vocab: usize,
    /// `word`: words seen fewer times are unknown. Default 1.
    pub min_freq: usize,
    /// Lower-case the text first. Default true.
    pub lowercase: bool,
}

impl Serialize for TokenizerSection {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let word = self.kind == TokenizerKind::Word;
        let mut t = s.serialize_struct("TokenizerSection", if word { 4 } else { 2 })?;
        t.serialize_field("kind", &self.kind)?;
        if word {
            t.serialize_field("max_vocab", &self.max_vocab)?;
            t.serialize_field("min_freq", &self.min_freq)?;
        }
        t.serialize_field("lowercase", &self.lowercase)?;
        t.end()
    }
}

impl Default for TokenizerSection {
    fn default() -> Self {
        Self {
            kind: TokenizerKind::Word,
            max_vocab: 20000,
            min_freq: 1,
            lowercase: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TokenizerKind {
    Word,
    Byte,
}

/// `[padding]`: how variable-length sequences are batched (text data only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PaddingSection {
    /// `max_length` (every sequence padded or cut to `max_length`), `dynamic` (each batch
    /// padded to its longest sequence) or `bucket` (batches drawn from buckets of similar
    /// length, then padded to their longest). Default `dynamic`.
    pub strategy: PaddingStrategy,
    /// Sequences are cut to this many tokens; `max_length` pads every batch to it. Default 256.
    #[schemars(range(min = 1, max = 65536))]
    pub max_length: usize,
    /// Padded lengths are rounded up to a multiple of this (8 suits tensor cores). Default 1.
    #[schemars(range(min = 1))]
    pub multiple_of: usize,
    /// The token id of padding; the tokenizer keeps it free. Default 0.
    pub pad_id: u32,
    /// `bucket`: buckets, split at quantiles of the training lengths. Default 8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub buckets: Option<usize>,
}

impl Default for PaddingSection {
    fn default() -> Self {
        Self {
            strategy: PaddingStrategy::Dynamic,
            max_length: 256,
            multiple_of: 1,
            pad_id: 0,
            buckets: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PaddingStrategy {
    MaxLength,
    Dynamic,
    Bucket,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum DataFormat {
    #[serde(rename = "cifar10-bin")]
    Cifar10Bin,
    #[serde(rename = "synthetic")]
    Synthetic,
    #[serde(rename = "jsonl")]
    Jsonl,
}

impl DataFormat {
    pub const ALL: [DataFormat; 3] = [
        DataFormat::Cifar10Bin,
        DataFormat::Jsonl,
        DataFormat::Synthetic,
    ];

    /// As a recipe writes it.
    pub fn name(self) -> &'static str {
        match self {
            DataFormat::Cifar10Bin => "cifar10-bin",
            DataFormat::Synthetic => "synthetic",
            DataFormat::Jsonl => "jsonl",
        }
    }

    /// One line for `runner ls`.
    pub fn about(self) -> &'static str {
        match self {
            DataFormat::Cifar10Bin => "CIFAR-10 binary records (1 label byte + 3,072 pixel bytes); a file or a cifar-10-batches-bin directory",
            DataFormat::Synthetic => "deterministic generated images, no files",
            DataFormat::Jsonl => "text, one JSON object a line (data.text_field, data.label_field); word or byte tokenizer",
        }
    }
}

/// `[data.normalize]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct NormalizeSection {
    /// Per-channel mean of pixels scaled to 0..1 (one value, or one per channel).
    /// Default `[0.0]`: with the default `std`, pixels stay scaled to 0..1, as without the
    /// table, so a table that names only `on` changes where, not what.
    pub mean: Vec<f32>,
    /// Per-channel standard deviation, same shape as `mean`. Default `[1.0]`.
    pub std: Vec<f32>,
    /// `host`: loader workers convert to normalised f32 before the copy; `device`: bytes
    /// (u8, a quarter of the f32 size) are copied and normalised on the device. Default `host`.
    pub on: NormalizeOn,
}

impl Default for NormalizeSection {
    fn default() -> Self {
        Self {
            mean: vec![0.0],
            std: vec![1.0],
            on: NormalizeOn::Host,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NormalizeOn {
    Host,
    Device,
}

/// `[data.augment]`: applied to training samples only, deterministic per (seed, epoch, sample).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AugmentSection {
    /// Random crop back to the image size after zero-padding each side by this many pixels.
    /// Default 0 (off). CIFAR practice: 4.
    pub crop_padding: usize,
    /// Random horizontal flip with probability 1/2. Default false.
    pub hflip: bool,
}

/// `[data.synthetic]`: deterministic generated images, each class a distinct pattern plus noise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SyntheticSection {
    /// Training samples. Default 1024.
    #[schemars(range(min = 1, max = 10000000))]
    pub samples: usize,
    /// Test samples. Default 256.
    #[schemars(range(max = 10000000))]
    pub test_samples: usize,
    /// Classes. Default 10.
    #[schemars(range(min = 2, max = 100000))]
    pub classes: usize,
    /// Image side in pixels. Default 32.
    #[schemars(range(min = 1, max = 1024))]
    pub image_size: usize,
    /// Channels. Default 3.
    #[schemars(range(min = 1, max = 64))]
    pub channels: usize,
}

impl Default for SyntheticSection {
    fn default() -> Self {
        Self {
            samples: 1024,
            test_samples: 256,
            classes: 10,
            image_size: 32,
            channels: 3,
        }
    }
}

/// `[loader]`: batching and the worker pool (PyTorch DataLoader semantics).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LoaderSection {
    /// Samples per micro-batch (one forward/backward). Default 64.
    #[schemars(range(min = 1))]
    pub batch_size: usize,
    /// Worker threads preparing batches; 0 prepares them on the training thread. Default 0.
    #[schemars(range(max = 256))]
    pub workers: usize,
    /// Stage each batch for a fast host-to-device copy (pinned memory on CUDA); does
    /// nothing on the CPU backend or WebGPU (a warning says so). Default false.
    pub pin_memory: bool,
    /// Keep the workers alive across epochs instead of starting them every epoch.
    /// Needs `workers > 0`. Default false.
    pub persistent_workers: bool,
    /// Batches each worker prepares ahead (PyTorch's `prefetch_factor`). Needs
    /// `workers > 0`. Default 2.
    #[schemars(range(min = 1, max = 1024))]
    pub prefetch: usize,
    /// Reshuffle the training samples every epoch. Default true.
    pub shuffle: bool,
    /// Drop the last incomplete batch of an epoch, and with `optim.accumulation_steps` the
    /// batches too few for a whole optimizer step. Default false.
    pub drop_last: bool,
}

impl Default for LoaderSection {
    fn default() -> Self {
        Self {
            batch_size: 64,
            workers: 0,
            pin_memory: false,
            persistent_workers: false,
            prefetch: 2,
            shuffle: true,
            drop_last: false,
        }
    }
}

/// `[optim]`: optimizer, gradient accumulation and learning-rate schedule (PyTorch semantics).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OptimSection {
    /// `sgd` or `adamw`. Default `sgd`.
    pub optimizer: OptimizerKind,
    /// Peak learning rate. Default 0.01.
    #[schemars(extend("exclusiveMinimum" = 0.0))]
    pub lr: f64,
    /// SGD momentum (no dampening, as `torch.optim.SGD`). Default 0. SGD only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub momentum: Option<f64>,
    /// SGD: L2 penalty added to the gradient; AdamW: decoupled decay. Default 0 for SGD,
    /// 0.01 for AdamW (the PyTorch defaults).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<f64>,
    /// SGD Nesterov momentum. Default false. SGD only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nesterov: Option<bool>,
    /// AdamW `(beta1, beta2)`. Default `[0.9, 0.999]`. AdamW only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub betas: Option<[f64; 2]>,
    /// AdamW epsilon. Default 1e-8 (PyTorch's; Burn's own default is 1e-5). AdamW only.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(extend("exclusiveMinimum" = 0.0))]
    pub eps: Option<f64>,
    /// Micro-batches whose gradients are summed (each loss weighted by its share of the
    /// step's samples: 1/N when they are alike) before one optimizer step; the effective
    /// batch is `batch_size × accumulation_steps`. Default 1.
    #[schemars(range(min = 1))]
    pub accumulation_steps: usize,
    /// `constant`, `cosine` (to `min_lr` at the last step) or `step` (× `gamma` every
    /// `step_size` optimizer steps). Default `constant`.
    pub schedule: Schedule,
    /// Linear learning-rate warm-up over this many optimizer steps (step k of W takes
    /// lr · k / W); the schedule counts its steps from the warm-up's end. Default 0.
    pub lr_warmup_steps: u64,
    /// `cosine`: final learning rate. Default 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_lr: Option<f64>,
    /// `step`: optimizer steps between decays. Default 1000.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub step_size: Option<u64>,
    /// `step`: decay factor. Default 0.1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gamma: Option<f64>,
    /// Clip the gradients' global L2 norm (all parameters together) to this, as
    /// `torch.nn.utils.clip_grad_norm_`. Default: no clipping.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip_grad_norm: Option<f64>,
    /// Label smoothing ε of the cross-entropy, as PyTorch's `label_smoothing`: targets
    /// `(1 − ε)·one_hot + ε / classes`. Default 0.
    #[schemars(range(min = 0.0), extend("exclusiveMaximum" = 1.0))]
    pub label_smoothing: f64,
}

impl Default for OptimSection {
    fn default() -> Self {
        Self {
            optimizer: OptimizerKind::Sgd,
            lr: 0.01,
            momentum: None,
            weight_decay: None,
            nesterov: None,
            betas: None,
            eps: None,
            accumulation_steps: 1,
            schedule: Schedule::Constant,
            lr_warmup_steps: 0,
            min_lr: None,
            step_size: None,
            gamma: None,
            clip_grad_norm: None,
            label_smoothing: 0.0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerKind {
    Sgd,
    Adamw,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    Constant,
    Cosine,
    Step,
}

/// `[cleanup]`: the memory-cleanup policy under study.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CleanupSection {
    /// When to clean up: `"never"`, `"step"` (after every optimizer step), `"epoch"` (after
    /// every epoch, and after the last step of a run that `run.max_steps` ends inside one)
    /// or an integer N (after every N optimizer steps). Default `"never"`.
    pub every: Every,
    /// What a cleanup does, in order: `sync` (wait for the device queue to drain),
    /// `empty_cache` (release the device memory pool's free blocks, Burn's
    /// `memory_cleanup`), `trim_host` (return freed host heap to the OS, glibc
    /// `malloc_trim`). Default `["sync", "empty_cache"]`.
    pub actions: Vec<CleanupAction>,
}

impl Default for CleanupSection {
    fn default() -> Self {
        Self {
            every: Every::Never,
            actions: vec![CleanupAction::Sync, CleanupAction::EmptyCache],
        }
    }
}

/// When cleanup runs. Written as a word or a positive integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Every {
    Never,
    Step,
    Epoch,
    Steps(u64),
}

impl JsonSchema for Every {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Every".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "\"never\", \"step\", \"epoch\" or a number of optimizer steps",
            "oneOf": [
                { "type": "string", "enum": ["never", "step", "epoch"] },
                { "type": "integer", "minimum": 1 }
            ]
        })
    }
}

impl Serialize for Every {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Every::Never => s.serialize_str("never"),
            Every::Step => s.serialize_str("step"),
            Every::Epoch => s.serialize_str("epoch"),
            Every::Steps(n) => s.serialize_u64(*n),
        }
    }
}

impl<'de> Deserialize<'de> for Every {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        const EXPECTED: &str = "\"never\", \"step\", \"epoch\" or a positive number of steps";
        impl serde::de::Visitor<'_> for V {
            type Value = Every;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Every, E> {
                match v {
                    "never" => Ok(Every::Never),
                    "step" => Ok(Every::Step),
                    "epoch" => Ok(Every::Epoch),
                    other => Err(E::invalid_value(serde::de::Unexpected::Str(other), &self)),
                }
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Every, E> {
                if v >= 1 {
                    Ok(Every::Steps(v as u64))
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Signed(v), &self))
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Every, E> {
                self.visit_i64(v.min(i64::MAX as u64) as i64)
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CleanupAction {
    Sync,
    EmptyCache,
    TrimHost,
}

/// `[run]`: how long to train and what to time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RunSection {
    /// Passes over the training data. Default 1.
    #[schemars(range(min = 1))]
    pub epochs: usize,
    /// Stop after this many optimizer steps, whatever `epochs` says. Default: no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_steps: Option<u64>,
    /// First optimizer steps left out of the timing summary (allocator and autotune
    /// warm-up). Default 5.
    pub warmup_steps: u64,
    /// When to measure test accuracy: `"epoch"` (after every epoch), `"end"` or `"never"`.
    /// Default `"end"`.
    pub eval: EvalWhen,
    /// A training loss above this (or not a number) means the run diverged. Default 1e4
    /// (cross-entropy starts near ln(classes), under 12 for any class count allowed).
    pub max_loss: f64,
    /// Stop a diverged run at the step it was seen (status `failed`, exit 1). With false
    /// the run goes on and `summary.json` records where it diverged. Default true.
    pub stop_on_divergence: bool,
    /// With `data.validation`: when to evaluate on it, `"epoch"`, `"step"`, every N
    /// optimizer steps, or `"never"`. Default `"epoch"`.
    pub validate: Every,
    /// With `data.validation`: stop when the validation metric has not improved for
    /// `patience` evaluations. Default: none (train all epochs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub early_stop: Option<EarlyStopSection>,
}

/// `run.early_stop = { metric = "val_accuracy", patience = 5 }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EarlyStopSection {
    /// `val_loss` or `val_accuracy`. Default `val_loss`.
    pub metric: EarlyStopMetric,
    /// Validation evaluations without improvement before stopping. Default 3.
    pub patience: u64,
    /// The least change that counts as an improvement. Default 0.
    pub min_delta: f64,
    /// `min` or `max`. Default: `min` for `val_loss`, `max` for `val_accuracy`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<EarlyStopMode>,
}

impl Default for EarlyStopSection {
    fn default() -> Self {
        Self {
            metric: EarlyStopMetric::ValLoss,
            patience: 3,
            min_delta: 0.0,
            mode: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EarlyStopMetric {
    ValLoss,
    ValAccuracy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EarlyStopMode {
    Min,
    Max,
}

impl Default for RunSection {
    fn default() -> Self {
        Self {
            epochs: 1,
            max_steps: None,
            warmup_steps: 5,
            eval: EvalWhen::End,
            max_loss: 1e4,
            stop_on_divergence: true,
            validate: Every::Epoch,
            early_stop: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EvalWhen {
    Epoch,
    End,
    Never,
}

impl EvalWhen {
    /// As a recipe spells it.
    pub fn name(self) -> &'static str {
        match self {
            EvalWhen::Epoch => "epoch",
            EvalWhen::End => "end",
            EvalWhen::Never => "never",
        }
    }
}

/// `[checkpoint]`: what a run saves to survive an interruption, and the weights it leaves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointSection {
    /// When to write a checkpoint (model, optimizer state, position in the data) into the
    /// run's `checkpoints/`: `"never"`, `"epoch"`, or every N optimizer steps. SIGINT,
    /// SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 write one whatever this says. Default `"never"`.
    pub every: Every,
    /// Checkpoints kept, the latest. Default 2.
    #[schemars(range(min = 1))]
    pub keep: usize,
    /// Save the trained weights as `model.safetensors` after the last step (before the final
    /// evaluation). Default true.
    pub save_final: bool,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        Self {
            every: Every::Never,
            keep: 2,
            save_final: true,
        }
    }
}

/// `[log]`: where metrics go and how often.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// Root of the run directories, relative to the working directory. Default `"runs"`.
    pub dir: String,
    /// Read losses back from the device every N optimizer steps (each read waits for the
    /// device) and write their `metrics.jsonl` lines then. Default 1.
    #[schemars(range(min = 1))]
    pub every: u64,
    /// Show a progress bar on a terminal; without one (a Slurm log, `nohup`), a line every
    /// 30 s. Default true.
    pub progress: bool,
    /// Also write each step's record to `metrics.csv` (the same fields as
    /// `metrics.jsonl`). Default true.
    pub csv: bool,
    /// Write TensorBoard event files (`events.out.tfevents.*`) in the run directory: loss,
    /// learning rate, step time, data-wait share, memory, utilisation, test accuracy.
    /// Default true.
    pub tensorboard: bool,
}

impl Default for LogSection {
    fn default() -> Self {
        Self {
            dir: "runs".into(),
            every: 1,
            progress: true,
            csv: true,
            tensorboard: true,
        }
    }
}

/// `[profile]`: what is measured beyond host timings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ProfileSection {
    /// Optimizer steps whose phases are timed with a device sync after each phase, as
    /// `"A..B"` (steps A to B-1) or `"A..=B"`, 1-based. Outside the window the loop runs
    /// unsynced and phase times are host times. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<String>,
    /// Interval of the utilisation sampler (NVML on CUDA, the process's CPU clock on the CPU), milliseconds;
    /// 0 turns sampling off. Default 100.
    pub sample_ms: u64,
    /// Read the device memory pool's figures after every step (`mem_in_use_bytes`,
    /// `mem_reserved_bytes`). On CUDA each reading is a round trip to CubeCL's device
    /// thread, after fusion launches what it still holds; `false` skips it (those columns
    /// stay empty; a cleanup still reads the pool to measure what it frees), which is how
    /// its cost per step is measured. Default true.
    pub memory: bool,
}

impl Default for ProfileSection {
    fn default() -> Self {
        Self {
            steps: None,
            sample_ms: 100,
            memory: true,
        }
    }
}

/// `[slurm]`: resources of the job-array script `runner sweep --slurm` writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmSection {
    /// Partition (`--partition`). Default: the cluster's default partition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Time limit of each array task (`--time`): minutes (`"90"`), `"MM:SS"`, `"HH:MM:SS"`,
    /// `"D-HH"`, `"D-HH:MM"`, `"D-HH:MM:SS"` or `"UNLIMITED"`. Default `"01:00:00"`.
    pub time: String,
    /// GPUs per array task (`--gpus-per-task`). Default 0.
    pub gpus_per_task: u32,
    /// CPU cores per array task (`--cpus-per-task`), at least 1. A GPU task with fewer
    /// than 4 runs without fusion (`backend.fusion = "auto"`: CubeCL's threads spin on
    /// their cores while they wait). Default 4 for tasks with a GPU (`gpus_per_task` > 0),
    /// else 2.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub cpus_per_task: Option<u32>,
    /// Memory per node (`--mem`), e.g. `"16G"`. Default: the cluster's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem: Option<String>,
    /// Account to charge (`--account`). Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// Further `#SBATCH` options, written as given, e.g. `["--qos=high"]`. Default none.
    pub extra: Vec<String>,
    /// Survive the time limit: Slurm sends SIGTERM 120 s before it (`--signal=B:TERM@120`),
    /// the runner checkpoints and stops, and the task requeues itself (`--requeue`) and
    /// resumes its cell from the checkpoint. Default true.
    pub requeue: bool,
    /// Compile and tune the grid's kernels once, in a job of their own (`runner warmup`),
    /// and start the array after it (`--dependency=afterany:`), so its tasks do not all
    /// compile the same kernels at once, each on its own GPU. Default: when tasks get a
    /// GPU (`gpus_per_task` > 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup: Option<bool>,
}

impl SlurmSection {
    /// `cpus_per_task`, or its default: 4 for a task with a GPU (one core for each of the
    /// three threads CubeCL's fused backend spins on, and one for the rest), 2 without.
    pub fn cpus(&self) -> u32 {
        self.cpus_per_task
            .unwrap_or(if self.gpus_per_task > 0 { 4 } else { 2 })
    }
}

impl Default for SlurmSection {
    fn default() -> Self {
        Self {
            partition: None,
            time: "01:00:00".into(),
            gpus_per_task: 0,
            cpus_per_task: None,
            mem: None,
            account: None,
            extra: vec![],
            requeue: true,
            warmup: None,
        }
    }
}

/// The tables of the format and the keys each allows, for the unknown-key check.
/// `T::deserialize` names its fields to serde; this asks it for them without data.
pub fn tables() -> Vec<(&'static str, &'static [&'static str])> {
    vec![
        ("", fields_of::<Recipe>()),
        ("backend", fields_of::<BackendSection>()),
        ("model", fields_of::<ModelSection>()),
        ("data", fields_of::<DataSection>()),
        ("data.normalize", fields_of::<NormalizeSection>()),
        ("data.augment", fields_of::<AugmentSection>()),
        ("data.synthetic", fields_of::<SyntheticSection>()),
        ("data.tokenizer", fields_of::<TokenizerSection>()),
        ("loader", fields_of::<LoaderSection>()),
        ("optim", fields_of::<OptimSection>()),
        ("cleanup", fields_of::<CleanupSection>()),
        ("run", fields_of::<RunSection>()),
        ("run.early_stop", fields_of::<EarlyStopSection>()),
        ("log", fields_of::<LogSection>()),
        ("profile", fields_of::<ProfileSection>()),
        ("slurm", fields_of::<SlurmSection>()),
        ("checkpoint", fields_of::<CheckpointSection>()),
        ("padding", fields_of::<PaddingSection>()),
    ]
}

/// The field names serde's derive gives a struct, found by letting it ask a stub deserializer.
fn fields_of<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
    use serde::de::{self, Visitor};
    struct Probe(Option<&'static [&'static str]>);
    #[derive(Debug)]
    struct Stop;
    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("probe")
        }
    }
    impl std::error::Error for Stop {}
    impl de::Error for Stop {
        fn custom<M: std::fmt::Display>(_: M) -> Self {
            Stop
        }
    }
    impl<'de> de::Deserializer<'de> for &mut Probe {
        type Error = Stop;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0 = Some(fields);
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut probe = Probe(None);
    let _ = T::deserialize(&mut probe);
    probe.0.unwrap_or(&[])
}

/// The schema's title: `runner schema -o` overwrites only a file that has it.
pub const TITLE: &str = "runner recipe";

/// The JSON Schema of the recipe format (draft 2020-12), for editors (taplo, VS Code's Even
/// Better TOML) and CI of recipe repositories. `extends` and `[sweep]` are read before the
/// typed tables, so they are added by hand.
pub fn json_schema() -> serde_json::Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(Recipe)).expect("schema is JSON");
    let props = schema["properties"]
        .as_object_mut()
        .expect("Recipe has properties");
    props.insert(
        "extends".into(),
        serde_json::json!({
            "type": "string",
            "description": "Path of a recipe this one builds on, relative to this file; its tables are merged under this file's."
        }),
    );
    let mut sweep = sweep_node("");
    sweep["description"] = "A grid: recipe keys mapped to lists of values, written quoted (\"loader.workers\" = [0, 2]), dotted or as tables ([sweep.loader] workers = [0, 2]); the cartesian product runs, the last key varying fastest. `name`, `description` and [slurm] cannot be swept.".into();
    props.insert("sweep".into(), sweep);
    schema["title"] = TITLE.into();
    schema
}

/// Every leaf key of the format (`loader.workers`, ...): the tables' fields that are not
/// tables themselves.
pub fn leaf_keys() -> Vec<String> {
    let tables = tables();
    let mut out = vec![];
    for (t, fields) in &tables {
        for f in *fields {
            let k = if t.is_empty() {
                f.to_string()
            } else {
                format!("{t}.{f}")
            };
            if !tables.iter().any(|(p, _)| *p == k) {
                out.push(k);
            }
        }
    }
    out
}

/// The keys a grid may sweep: every leaf of the format but those of the grid as a whole
/// (`name`, `description`, `[slurm]`).
fn sweepable() -> Vec<String> {
    leaf_keys()
        .into_iter()
        .filter(|k| {
            !(matches!(k.as_str(), "name" | "description" | "extends" | "sweep")
                || k.starts_with("slurm."))
        })
        .collect()
}

/// The schema of `[sweep]` at the table `prefix` (`""` for `[sweep]` itself): each key
/// below it, however much of it is written dotted, maps to a list of values; each table
/// below it, written as a table, is a node of its own. Nothing else is allowed (a typo in
/// a swept key was accepted, and the dotted and table forms refused).
fn sweep_node(prefix: &str) -> serde_json::Value {
    let below = |k: &str| match prefix {
        "" => Some(k.to_string()),
        p => k.strip_prefix(&format!("{p}.")).map(str::to_string),
    };
    let mut props = serde_json::Map::new();
    let mut children = std::collections::BTreeSet::new();
    for k in sweepable() {
        let Some(rest) = below(&k) else { continue };
        if let Some((child, _)) = rest.split_once('.') {
            children.insert(child.to_string());
        }
        props.insert(rest, serde_json::json!({ "type": "array", "minItems": 1 }));
    }
    for child in children {
        let path = match prefix {
            "" => child.clone(),
            p => format!("{p}.{child}"),
        };
        props.insert(child, sweep_node(&path));
    }
    serde_json::json!({
        "type": "object",
        "properties": props,
        "additionalProperties": false
    })
}
