//! The networks a recipe can name: for images ResNet-18/34/50 (torchvision's layout, with a
//! CIFAR or ImageNet stem), a small CNN for quick CPU runs and an MLP; for token sequences a
//! bag-of-embeddings classifier, an LSTM and a Transformer encoder, each of which ignores
//! padding (so a sequence's logits do not depend on how much padding its batch has). Owns
//! architecture only; the training loop owns loss, optimisation and devices.

use std::sync::{Arc, Mutex};

use burn::module::{
    AutodiffModule, Content, Devices, Module, ModuleDisplay, ModuleDisplayDefault, ModuleMapper,
    ModuleVisitor, Param, ParamId,
};
use burn::nn::attention::MultiHeadAttention;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::lstm::{Lstm, LstmConfig};
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderLayer,
};
use burn::nn::GateController;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::activation::{quiet_softmax, relu, softmax};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Bool, Int, Tensor};

use crate::ops::{self, ModelBackend};
use crate::plan::{ModelPlan, NetPlan, TransformerPlan};
use crate::recipe::Stem;

/// Any of the networks, as one module type so the training loop is compiled once. One
/// value exists per run: the size difference between variants costs nothing, and boxing
/// would get in the way of Burn's `Module` derive.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Net<B: ModelBackend> {
    ResNet(ResNet<B>),
    SmallCnn(SmallCnn<B>),
    Mlp(Mlp<B>),
    Bag(Bag<B>),
    Lstm(LstmClassifier<B>),
    Transformer(TransformerClassifier<B>),
}

/// What a network reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Images of `channels × side × side`.
    Image { channels: usize, side: usize },
    /// Token ids below `vocab`, rows at most `max_len` long.
    Text { vocab: usize, max_len: usize },
}

/// A batch's inputs on the device.
pub enum Input<B: Backend> {
    Images(Tensor<B, 4>),
    /// `ids` `[batch, len]`; `pad` is true at padding; `lengths` counts each row's real tokens.
    Tokens {
        ids: Tensor<B, 2, Int>,
        pad: Tensor<B, 2, Bool>,
        lengths: Tensor<B, 1, Int>,
    },
}

impl<B: ModelBackend> Net<B> {
    /// An empty network (no parameters, nothing allocated): what holds a model's place
    /// while the optimizer owns it for a step.
    pub fn placeholder() -> Self {
        Net::Mlp(Mlp { layers: vec![] })
    }

    /// Builds the network for the data's shape (validation has paired them), its initial
    /// weights drawn from `seed` alone. Burn's generator is process-wide and draws lazily,
    /// so seeding and drawing every weight happen here under one lock: runs that share a
    /// process (tests, sweeps driven from a library) cannot interleave their draws.
    pub fn new(m: &ModelPlan, shape: Shape, seed: u64, device: &B::Device) -> Self {
        static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _guard = INIT.lock().unwrap_or_else(|p| p.into_inner());
        B::seed(device, seed);
        let net = Self::build(m, shape, device);
        net.materialize();
        net.in_device_layouts()
    }

    /// The same model with each convolution weight held in the memory layout the
    /// backend's convolutions read without a copy ([`ops::ConvBackend::conv_weight_layout`]:
    /// channels-last on CubeCL's backends, as it is on the CPU). Each weight stays a leaf
    /// with its id, so its gradient, the optimizer's state and the records are as before;
    /// the optimizers write a parameter in its own layout, so the weights keep it. Called
    /// when the model is built and when weights are loaded into it.
    pub fn in_device_layouts(self) -> Self {
        struct Layouts;
        impl<B: ModelBackend> ModuleMapper<B> for Layouts {
            fn map_float<const D: usize>(
                &mut self,
                param: Param<Tensor<B, D>>,
            ) -> Param<Tensor<B, D>> {
                if D != 4 {
                    return param;
                }
                param.map(|t| {
                    let require_grad = t.is_require_grad();
                    let w = Tensor::<B, 4>::from_primitive(t.into_primitive());
                    let out =
                        Tensor::<B, D>::from_primitive(ops::conv_weight_layout(w).into_primitive());
                    if require_grad {
                        out.require_grad()
                    } else {
                        out
                    }
                })
            }
        }
        self.map(&mut Layouts)
    }

    fn build(m: &ModelPlan, shape: Shape, device: &B::Device) -> Self {
        let (channels, side, vocab, max_len) = match shape {
            Shape::Image { channels, side } => (channels, side, 0, 0),
            Shape::Text { vocab, max_len } => (0, 0, vocab, max_len),
        };
        let classes = m.num_classes;
        let resnet = |kind, layers, stem| {
            Net::ResNet(ResNet::new(kind, layers, stem, channels, classes, device))
        };
        match &m.net {
            NetPlan::Resnet18 { stem } => resnet(Block::Basic, [2, 2, 2, 2], *stem),
            NetPlan::Resnet34 { stem } => resnet(Block::Basic, [3, 4, 6, 3], *stem),
            NetPlan::Resnet50 { stem } => resnet(Block::Bottleneck, [3, 4, 6, 3], *stem),
            NetPlan::SmallCnn { width } => {
                Net::SmallCnn(SmallCnn::new(channels, side, *width, classes, device))
            }
            NetPlan::Mlp { hidden } => {
                Net::Mlp(Mlp::new(channels * side * side, hidden, classes, device))
            }
            NetPlan::Bag { embed_dim, hidden } => {
                Net::Bag(Bag::new(vocab, *embed_dim, hidden, classes, device))
            }
            NetPlan::Lstm {
                embed_dim,
                hidden_size,
                layers,
            } => Net::Lstm(LstmClassifier::new(
                vocab,
                [*embed_dim, *hidden_size, *layers],
                classes,
                device,
            )),
            NetPlan::Transformer(t) => Net::Transformer(TransformerClassifier::new(
                vocab, max_len, t, classes, device,
            )),
        }
    }

    /// Initialises every parameter now, in module order (Burn would on first use).
    fn materialize(&self) {
        struct Touch;
        impl<B: Backend> ModuleVisitor<B> for Touch {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                let _ = param.val();
            }
        }
        self.visit(&mut Touch);
    }

    /// Trainable parameters, as torchvision counts them. Burn's `num_params` also counts
    /// BatchNorm's running statistics (buffers in PyTorch), which are taken out here.
    pub fn parameters(&self) -> usize {
        let buffers = match self {
            Net::ResNet(n) => {
                n.stem.buffers()
                    + n.blocks
                        .iter()
                        .map(|b| {
                            b.convs
                                .iter()
                                .chain(&b.downsample)
                                .map(ConvBn::buffers)
                                .sum::<usize>()
                        })
                        .sum::<usize>()
            }
            Net::SmallCnn(n) => n.c1.buffers() + n.c2.buffers(),
            Net::Mlp(_) | Net::Bag(_) | Net::Lstm(_) | Net::Transformer(_) => 0,
        };
        Module::num_params(self) - buffers
    }

    /// Inputs → logits `[batch, classes]`.
    pub fn forward(&self, input: Input<B>) -> Tensor<B, 2> {
        match (self, input) {
            (Net::ResNet(n), Input::Images(x)) => n.forward(x),
            (Net::SmallCnn(n), Input::Images(x)) => n.forward(x),
            (Net::Mlp(n), Input::Images(x)) => n.forward(x),
            (Net::Bag(n), Input::Tokens { ids, pad, .. }) => n.forward(ids, pad),
            (Net::Lstm(n), Input::Tokens { ids, lengths, .. }) => n.forward(ids, lengths),
            (Net::Transformer(n), Input::Tokens { ids, pad, .. }) => n.forward(ids, pad),
            _ => unreachable!("validation pairs image models with image data"),
        }
    }
}

/// Convolution without bias followed by batch norm: the ResNet unit.
#[derive(Module, Debug)]
pub struct ConvBn<B: ModelBackend> {
    conv: Conv2d<B>,
    bn: BatchNorm2d<B>,
}

impl<B: ModelBackend> ConvBn<B> {
    fn new(cin: usize, cout: usize, kernel: usize, stride: usize, device: &B::Device) -> Self {
        let pad = Self::padding(kernel);
        Self {
            conv: Conv2dConfig::new([cin, cout], [kernel, kernel])
                .with_stride([stride, stride])
                .with_padding(PaddingConfig2d::Explicit(pad, pad, pad, pad))
                .with_bias(false)
                .init(device),
            bn: BatchNorm2d::new(cout, device),
        }
    }

    /// Zero padding on every side: the output keeps the input's size at stride 1.
    fn padding(kernel: usize) -> usize {
        kernel / 2
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        self.forward_act(x, None, false)
    }

    /// `relu?(bn(conv(x)) + residual?)`.
    fn forward_act(
        &self,
        x: Tensor<B, 4>,
        residual: Option<Tensor<B, 4>>,
        relu: bool,
    ) -> Tensor<B, 4> {
        // Burn's `Conv2d` holds the weight and its settings (and names them in records);
        // the arithmetic is ours, so the CPU backend runs its own kernels (src/conv).
        let c = &self.conv;
        let padding = c.kernel_size.map(Self::padding);
        let options = ConvOptions::new(c.stride, padding, c.dilation, c.groups);
        self.bn
            .forward_act(ops::conv2d(x, c.weight.val(), options), residual, relu)
    }

    /// Elements of the batch norm's running statistics.
    fn buffers(&self) -> usize {
        2 * self.bn.gamma.val().dims()[0]
    }
}

/// Batch normalisation over `[N, C, H, W]`, as `torch.nn.BatchNorm2d` (eps 1e-5, momentum
/// 0.1, running variance unbiased). Burn's own `BatchNorm` computes the same, but through
/// `swap_dims` copies and `[1, C, 1, 1]` broadcasts that the Flex CPU backend walks element
/// by element (half of a small CNN's step time). Training calls one op
/// ([`ops::batch_norm_train_act`]: two passes over memory each way on the CPU, Burn's
/// tensor ops fused, channels-last, on CUDA); so does evaluation
/// ([`ops::batch_norm_eval`]: `[N·C, H·W]` rows with per-row scalars on the CPU).
#[derive(Module, Debug)]
pub struct BatchNorm2d<B: ModelBackend> {
    pub gamma: Param<Tensor<B, 1>>,
    pub beta: Param<Tensor<B, 1>>,
    pub running_mean: Running<Tensor<B, 1>>,
    pub running_var: Running<Tensor<B, 1>>,
}

impl<B: ModelBackend> BatchNorm2d<B> {
    const EPS: f64 = 1e-5;
    const MOMENTUM: f64 = 0.1;

    pub fn new(channels: usize, device: &B::Device) -> Self {
        Self {
            gamma: Param::from_tensor(Tensor::ones([channels], device)),
            beta: Param::from_tensor(Tensor::zeros([channels], device)),
            running_mean: Running::new(Tensor::zeros([channels], device)),
            running_var: Running::new(Tensor::ones([channels], device)),
        }
    }

    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        self.forward_act(x, None, false)
    }

    /// `relu?(bn(x) + residual?)`: in training by the batch's statistics
    /// ([`ops::batch_norm_train_act`]), in evaluation by the running ones
    /// ([`ops::batch_norm_eval`]).
    pub fn forward_act(
        &self,
        x: Tensor<B, 4>,
        residual: Option<Tensor<B, 4>>,
        relu: bool,
    ) -> Tensor<B, 4> {
        let [n, _, h, w] = x.dims();
        if B::ad_enabled(&x.device()) {
            // Training: the batch's statistics, in one op (src/ops/norm.rs).
            let (gamma, beta) = (self.gamma.val(), self.beta.val());
            let (out, mean, var) =
                ops::batch_norm_train_act(x, gamma, beta, Self::EPS, residual, relu);
            let running = (self.running_mean.value(), self.running_var.value());
            let (new_mean, new_var) =
                ops::batch_norm_running(running, (mean, var), n * h * w, Self::MOMENTUM);
            self.running_mean.set(new_mean.detach());
            self.running_var.set(new_var.detach());
            return out;
        }
        // Evaluation: the running statistics (src/ops/norm.rs).
        ops::batch_norm_eval(
            x,
            (self.running_mean.value(), self.running_var.value()),
            (self.gamma.val(), self.beta.val()),
            Self::EPS,
            residual,
            relu,
        )
    }
}

/// A batch norm's running statistic: a tensor that each training step replaces, saved and
/// loaded as Burn's `RunningState` is (its record is a [`Param`] of the same id, so
/// checkpoints, weights files and torchvision imports keep their names and layout).
///
/// Why not `RunningState`: it keeps each thread's update aside and, when it is next read,
/// averages the updates of all threads, dividing by their count even where there is one
/// thread: a kernel launch on a GPU for every statistic at every step (106 of an unfused
/// ResNet-50 step's, on the stand-in driver). The runner trains a model on one thread, so
/// an update simply replaces the value. Clones share the value, as they share
/// `RunningState`'s.
#[derive(Clone, Debug)]
pub struct Running<V> {
    id: ParamId,
    value: Arc<Mutex<V>>,
}

impl<V: Clone> Running<V> {
    fn with_id(id: ParamId, value: V) -> Self {
        Self {
            id,
            value: Arc::new(Mutex::new(value)),
        }
    }

    pub fn new(value: V) -> Self {
        Self::with_id(ParamId::new(), value)
    }

    /// The current value.
    pub fn value(&self) -> V {
        self.lock().clone()
    }

    /// Replaces the value (for every clone).
    pub fn set(&self, value: V) {
        *self.lock() = value;
    }

    /// The value, even where a thread panicked while holding it (a replacement is one
    /// assignment: the value is whole either way).
    fn lock(&self) -> std::sync::MutexGuard<'_, V> {
        self.value.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<const D: usize, B: Backend> Module<B> for Running<Tensor<B, D>> {
    type Record = Param<Tensor<B, D>>;

    fn visit<V: ModuleVisitor<B>>(&self, visitor: &mut V) {
        visitor.visit_float(&Param::initialized(self.id, self.value()))
    }

    fn map<M: ModuleMapper<B>>(self, mapper: &mut M) -> Self {
        let (_, value, _) = mapper
            .map_float(Param::initialized(self.id, self.value()))
            .consume();
        self.set(value);
        self
    }

    fn into_record(self) -> Self::Record {
        Param::initialized(self.id, self.value())
    }

    fn load_record(mut self, record: Self::Record) -> Self {
        let device = self.value().device();
        self.set(record.val().to_device(&device));
        self.id = record.id;
        self
    }

    fn to_device(self, device: &B::Device) -> Self {
        let value = self.value().to_device(device);
        self.set(value);
        self
    }

    fn fork(self, device: &B::Device) -> Self {
        // No gradient to detach: as `to_device`.
        self.to_device(device)
    }

    fn collect_devices(&self, mut devices: Devices<B>) -> Devices<B> {
        let device = self.value().device();
        if !devices.contains(&device) {
            devices.push(device)
        }
        devices
    }
}

impl<const D: usize, B: AutodiffBackend> AutodiffModule<B> for Running<Tensor<B, D>> {
    type InnerModule = Running<Tensor<B::InnerBackend, D>>;

    fn valid(&self) -> Self::InnerModule {
        Running::with_id(self.id, self.value().inner())
    }

    fn from_inner(module: Self::InnerModule) -> Self {
        Running::with_id(module.id, Tensor::from_inner(module.value()))
    }
}

impl<V> ModuleDisplayDefault for Running<V> {
    fn content(&self, content: Content) -> Option<Content> {
        content.add_formatted(&"Running".to_string()).optional()
    }
}

impl<V> ModuleDisplay for Running<V> {}

#[derive(Debug, Clone, Copy)]
pub enum Block {
    /// Two 3×3 convolutions (ResNet-18/34).
    Basic,
    /// 1×1 reduce, 3×3 (carrying the stride, as torchvision's v1.5), 1×1 expand ×4 (ResNet-50).
    Bottleneck,
}

/// One residual block.
#[derive(Module, Debug)]
pub struct Residual<B: ModelBackend> {
    convs: Vec<ConvBn<B>>,
    downsample: Option<ConvBn<B>>,
}

impl<B: ModelBackend> Residual<B> {
    fn new(
        kind: Block,
        cin: usize,
        width: usize,
        stride: usize,
        device: &B::Device,
    ) -> (Self, usize) {
        let (convs, cout) = match kind {
            Block::Basic => (
                vec![
                    ConvBn::new(cin, width, 3, stride, device),
                    ConvBn::new(width, width, 3, 1, device),
                ],
                width,
            ),
            Block::Bottleneck => (
                vec![
                    ConvBn::new(cin, width, 1, 1, device),
                    ConvBn::new(width, width, 3, stride, device),
                    ConvBn::new(width, width * 4, 1, 1, device),
                ],
                width * 4,
            ),
        };
        let downsample =
            (stride != 1 || cin != cout).then(|| ConvBn::new(cin, cout, 1, stride, device));
        (Self { convs, downsample }, cout)
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let (last, body) = self.convs.split_last().expect("a block has convolutions");
        let mut out = x.clone();
        for c in body {
            out = c.forward_act(out, None, true);
        }
        let identity = match &self.downsample {
            Some(d) => d.forward(x),
            None => x,
        };
        last.forward_act(out, Some(identity), true)
    }
}

#[derive(Module, Debug)]
pub struct ResNet<B: ModelBackend> {
    stem: ConvBn<B>,
    stem_pool: Option<MaxPool2d>,
    blocks: Vec<Residual<B>>,
    pool: AdaptiveAvgPool2d,
    fc: Linear<B>,
}

impl<B: ModelBackend> ResNet<B> {
    fn new(
        kind: Block,
        layers: [usize; 4],
        stem: Stem,
        channels: usize,
        classes: usize,
        device: &B::Device,
    ) -> Self {
        let (stem, stem_pool) = match stem {
            Stem::Cifar => (ConvBn::new(channels, 64, 3, 1, device), None),
            Stem::Imagenet => (
                ConvBn::new(channels, 64, 7, 2, device),
                Some(
                    MaxPool2dConfig::new([3, 3])
                        .with_strides([2, 2])
                        .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                        .init(),
                ),
            ),
        };
        let mut blocks = vec![];
        let mut cin = 64;
        for (stage, &n) in layers.iter().enumerate() {
            let width = 64 << stage;
            for i in 0..n {
                let stride = if stage > 0 && i == 0 { 2 } else { 1 };
                let (b, cout) = Residual::new(kind, cin, width, stride, device);
                blocks.push(b);
                cin = cout;
            }
        }
        Self {
            stem,
            stem_pool,
            blocks,
            pool: AdaptiveAvgPool2dConfig::new([1, 1]).init(),
            fc: LinearConfig::new(cin, classes).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let mut x = self.stem.forward_act(x, None, true);
        if let Some(p) = &self.stem_pool {
            x = ops::max_pool2d(p, x);
        }
        for b in &self.blocks {
            x = b.forward(x);
        }
        let x = self.pool.forward(x).flatten::<2>(1, 3);
        ops::linear(&self.fc, x)
    }
}

/// Two conv–BN–ReLU–max-pool blocks and a two-layer head: about 0.6 M parameters for
/// 32×32 input at width 32; trains Fashion-MNIST past 80% in a minute on two cores.
#[derive(Module, Debug)]
pub struct SmallCnn<B: ModelBackend> {
    c1: ConvBn<B>,
    c2: ConvBn<B>,
    pool: MaxPool2d,
    fc1: Linear<B>,
    fc2: Linear<B>,
}

impl<B: ModelBackend> SmallCnn<B> {
    fn new(channels: usize, side: usize, width: usize, classes: usize, device: &B::Device) -> Self {
        let flat = 2 * width * (side / 4) * (side / 4);
        Self {
            c1: ConvBn::new(channels, width, 3, 1, device),
            c2: ConvBn::new(width, 2 * width, 3, 1, device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            fc1: LinearConfig::new(flat, 128).init(device),
            fc2: LinearConfig::new(128, classes).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = ops::max_pool2d(&self.pool, self.c1.forward_act(x, None, true));
        let x = ops::max_pool2d(&self.pool, self.c2.forward_act(x, None, true));
        let x = x.flatten::<2>(1, 3);
        ops::linear(&self.fc2, relu(ops::linear(&self.fc1, x)))
    }
}

/// Fully connected layers with ReLU between them.
#[derive(Module, Debug)]
pub struct Mlp<B: ModelBackend> {
    layers: Vec<Linear<B>>,
}

impl<B: ModelBackend> Mlp<B> {
    fn new(inputs: usize, hidden: &[usize], classes: usize, device: &B::Device) -> Self {
        let mut sizes = vec![inputs];
        sizes.extend_from_slice(hidden);
        sizes.push(classes);
        Self {
            layers: sizes
                .windows(2)
                .map(|w| LinearConfig::new(w[0], w[1]).init(device))
                .collect(),
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        mlp_head(&self.layers, x.flatten::<2>(1, 3))
    }
}

fn mlp_head<B: ModelBackend>(layers: &[Linear<B>], mut x: Tensor<B, 2>) -> Tensor<B, 2> {
    let last = layers.len() - 1;
    for (i, l) in layers.iter().enumerate() {
        x = ops::linear(l, x);
        if i < last {
            x = relu(x);
        }
    }
    x
}

/// fastText-style: the mean of the sequence's token embeddings (padding excluded), then
/// fully connected layers.
#[derive(Module, Debug)]
pub struct Bag<B: ModelBackend> {
    embed: Embedding<B>,
    head: Vec<Linear<B>>,
}

impl<B: ModelBackend> Bag<B> {
    fn new(
        vocab: usize,
        embed_dim: usize,
        hidden: &[usize],
        classes: usize,
        device: &B::Device,
    ) -> Self {
        let mut sizes = vec![embed_dim];
        sizes.extend_from_slice(hidden);
        sizes.push(classes);
        Self {
            embed: EmbeddingConfig::new(vocab, embed_dim).init(device),
            head: sizes
                .windows(2)
                .map(|w| LinearConfig::new(w[0], w[1]).init(device))
                .collect(),
        }
    }

    fn forward(&self, ids: Tensor<B, 2, Int>, pad: Tensor<B, 2, Bool>) -> Tensor<B, 2> {
        mlp_head(&self.head, ops::masked_mean(self.embed.forward(ids), pad))
    }
}

/// Stacked unidirectional LSTMs read the sequence; the classifier sees the hidden state at
/// each row's last real token, which padding after it cannot reach.
#[derive(Module, Debug)]
pub struct LstmClassifier<B: ModelBackend> {
    embed: Embedding<B>,
    layers: Vec<Lstm<B>>,
    out: Linear<B>,
}

impl<B: ModelBackend> LstmClassifier<B> {
    /// `[embed_dim, hidden_size, layers]`.
    fn new(vocab: usize, sizes: [usize; 3], classes: usize, device: &B::Device) -> Self {
        let [embed_dim, hidden_size, layers] = sizes;
        let layers = (0..layers)
            .map(|i| {
                let input = if i == 0 { embed_dim } else { hidden_size };
                LstmConfig::new(input, hidden_size, true).init(device)
            })
            .collect();
        Self {
            embed: EmbeddingConfig::new(vocab, embed_dim).init(device),
            layers,
            out: LinearConfig::new(hidden_size, classes).init(device),
        }
    }

    fn forward(&self, ids: Tensor<B, 2, Int>, lengths: Tensor<B, 1, Int>) -> Tensor<B, 2> {
        let mut x = self.embed.forward(ids);
        for l in &self.layers {
            x = lstm_forward(l, x);
        }
        let [b, _, h] = x.dims();
        let last = (lengths - 1).reshape([b, 1, 1]).repeat_dim(2, h);
        ops::linear(&self.out, x.gather(1, last).reshape([b, h]))
    }
}

/// Burn's `Lstm::forward` (burn-nn 0.21) from a zero state, on Burn's own module (so
/// records are unchanged), with its gates' products joined: the gates' input weights side
/// by side multiply every step's input at once (`[b·t, e]` by `[e, 4h]`), and their hidden
/// weights side by side the hidden state, once a step (`[b, h]` by `[h, 4h]`), on
/// [`ops::matmul`]. Burn's makes eight products a step, two a gate, each on its autotuned
/// matmul on CUDA (`backend.matmul`). Each gate's value is the same sum, `(x·Wᵢ + bᵢ) +
/// (h·Wₕ + bₕ)`, taken as a slice.
fn lstm_forward<B: ModelBackend>(l: &Lstm<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    let x = match l.batch_first {
        true => x,
        false => x.swap_dims(0, 1),
    };
    let device = x.device();
    let [b, t, e] = x.dims();
    let h = l.d_hidden;
    // (A coupled forget gate, `input_forget`, has no product of its own.)
    let mut gates = vec![&l.input_gate];
    if !l.input_forget {
        gates.push(&l.forget_gate);
    }
    gates.extend([&l.output_gate, &l.cell_gate]);
    let g = gates.len();
    let joined = |layer: fn(&GateController<B>) -> &Linear<B>| {
        let weight = Tensor::cat(gates.iter().map(|c| layer(c).weight.val()).collect(), 1);
        let bias: Option<Vec<Tensor<B, 1>>> = (gates.iter())
            .map(|c| layer(c).bias.as_ref().map(|p| p.val()))
            .collect();
        (weight, bias.map(|v| Tensor::cat(v, 0).unsqueeze::<2>()))
    };
    let with_bias = |y: Tensor<B, 2>, bias: &Option<Tensor<B, 2>>| match bias {
        Some(bias) => y + bias.clone(),
        None => y,
    };
    let (w_in, b_in) = joined(|c| &c.input_transform);
    let (w_hidden, b_hidden) = joined(|c| &c.hidden_transform);
    let inputs = with_bias(ops::matmul(x.reshape([b * t, e]), w_in), &b_in).reshape([b, t, g * h]);
    let mut out = Tensor::<B, 3>::empty([b, t, h], &device);
    let mut cell = Tensor::<B, 2>::zeros([b, h], &device);
    let mut hidden = Tensor::<B, 2>::zeros([b, h], &device);
    let order: Vec<usize> = match l.reverse {
        true => (0..t).rev().collect(),
        false => (0..t).collect(),
    };
    for i in order {
        let input_part = inputs
            .clone()
            .slice([0..b, i..i + 1, 0..g * h])
            .reshape([b, g * h]);
        let sums = input_part + with_bias(ops::matmul(hidden.clone(), w_hidden.clone()), &b_hidden);
        let gate = |k: usize| sums.clone().slice([0..b, k * h..(k + 1) * h]);
        let input = l.gate_activation.forward(gate(0));
        let forget = match l.input_forget {
            true => input.clone().neg().add_scalar(1.0),
            false => l.gate_activation.forward(gate(1)),
        };
        let output = l.gate_activation.forward(gate(g - 2));
        let candidate = l.cell_activation.forward(gate(g - 1));
        cell = forget * cell + input * candidate;
        if let Some(clip) = l.clip {
            cell = cell.clamp(-clip, clip);
        }
        hidden = output * l.hidden_activation.forward(cell.clone());
        out = out.slice_assign([0..b, i..i + 1, 0..h], hidden.clone().unsqueeze_dim(1));
    }
    match l.batch_first {
        true => out,
        false => out.swap_dims(0, 1),
    }
}

/// Token and learned position embeddings, a Transformer encoder whose attention ignores
/// padded keys, the mean over real positions, and a linear classifier.
#[derive(Module, Debug)]
pub struct TransformerClassifier<B: ModelBackend> {
    embed: Embedding<B>,
    position: Embedding<B>,
    encoder: TransformerEncoder<B>,
    out: Linear<B>,
}

impl<B: ModelBackend> TransformerClassifier<B> {
    fn new(
        vocab: usize,
        max_len: usize,
        t: &TransformerPlan,
        classes: usize,
        device: &B::Device,
    ) -> Self {
        Self {
            embed: EmbeddingConfig::new(vocab, t.embed_dim).init(device),
            position: EmbeddingConfig::new(max_len.max(1), t.embed_dim).init(device),
            encoder: TransformerEncoderConfig::new(t.embed_dim, t.ff_dim, t.heads, t.layers)
                .with_dropout(t.dropout)
                .with_norm_first(true)
                .init(device),
            out: LinearConfig::new(t.embed_dim, classes).init(device),
        }
    }

    fn forward(&self, ids: Tensor<B, 2, Int>, pad: Tensor<B, 2, Bool>) -> Tensor<B, 2> {
        let [b, t] = ids.dims();
        let device = ids.device();
        let positions = Tensor::<B, 1, Int>::arange(0..t as i64, &device)
            .reshape([1, t])
            .repeat_dim(0, b);
        let x = self.embed.forward(ids) + self.position.forward(positions);
        let x = encoder_forward(&self.encoder, x, pad.clone());
        ops::linear(&self.out, ops::masked_mean(x, pad))
    }
}

/// Burn's `TransformerEncoder::forward` (burn-nn 0.21) with padded keys masked, its
/// products on [`ops::matmul`] (the linear layers' and attention's): the same operations
/// in the same order (dropout draws included), on Burn's own modules, so records are
/// unchanged. Burn's own would send every product to its autotuned matmul on CUDA
/// (`backend.matmul`: 167 of the Transformer recipe's 381 cold compilations behind the
/// stand-in driver, and a text batch of a new length tunes them all again).
fn encoder_forward<B: ModelBackend>(
    encoder: &TransformerEncoder<B>,
    mut x: Tensor<B, 3>,
    pad: Tensor<B, 2, Bool>,
) -> Tensor<B, 3> {
    for layer in &encoder.layers {
        x = encoder_layer(layer, x, pad.clone());
    }
    x
}

/// `TransformerEncoderLayer::forward`.
fn encoder_layer<B: ModelBackend>(
    l: &TransformerEncoderLayer<B>,
    x: Tensor<B, 3>,
    pad: Tensor<B, 2, Bool>,
) -> Tensor<B, 3> {
    let residual = match l.norm_first {
        true => l.norm_2.forward(x.clone()),
        false => x.clone(),
    };
    let residual = l.dropout.forward(self_attention(&l.mha, residual, pad));
    let mut x = x + residual;
    let residual = if l.norm_first {
        l.norm_1.forward(x.clone())
    } else {
        x = l.norm_1.forward(x);
        x.clone()
    };
    let ff = &l.pwff;
    let inner = ff
        .activation
        .forward(ops::linear_3d(&ff.linear_inner, residual));
    let residual = ops::linear_3d(&ff.linear_outer, ff.dropout.forward(inner));
    let x = x + l.dropout.forward(residual);
    match l.norm_first {
        true => x,
        false => l.norm_2.forward(x),
    }
}

/// `MultiHeadAttention::forward` on self-attention with a padding mask: the context.
fn self_attention<B: ModelBackend>(
    m: &MultiHeadAttention<B>,
    x: Tensor<B, 3>,
    pad: Tensor<B, 2, Bool>,
) -> Tensor<B, 3> {
    let [b, t, d] = x.dims();
    let heads = |layer: &Linear<B>| {
        ops::linear_3d(layer, x.clone())
            .reshape([b, t, m.n_heads, m.d_k])
            .swap_dims(1, 2)
    };
    let (query, key, value) = (heads(&m.query), heads(&m.key), heads(&m.value));
    let scores = ops::matmul(query, key.transpose()).div_scalar((m.d_k as f32).sqrt());
    let scores = m.dropout.forward(scores);
    let scores = scores.mask_fill(pad.reshape([b, 1, 1, t]), m.min_float);
    let weights = match m.quiet_softmax {
        true => quiet_softmax(scores, 3),
        false => softmax(scores, 3),
    };
    let context = ops::matmul(weights, value)
        .swap_dims(1, 2)
        .reshape([b, t, d]);
    ops::linear_3d(&m.output, context)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::nn::{BatchNorm, BatchNormConfig};
    use burn::tensor::{Distribution, TensorData};

    type B = Autodiff<Flex>;

    fn close(a: TensorData, b: TensorData, tol: f32, what: &str) {
        let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < tol, "{what}: differs by {worst}");
    }

    #[test]
    fn batch_norm_matches_burns_in_output_and_gradients() {
        // Rows of 30 (the 16-lane sums' tail), 64 (lanes only) and 1 value, one image.
        for dims in [[4, 3, 5, 6], [2, 5, 8, 8], [3, 2, 1, 1], [1, 4, 3, 3]] {
            batch_norm_matches(dims);
        }
    }

    fn batch_norm_matches(dims: [usize; 4]) {
        let d = Default::default();
        let c = dims[1];
        let x = Tensor::<B, 4>::random(dims, Distribution::Normal(1.0, 2.0), &d).require_grad();
        let ours = BatchNorm2d::<B>::new(c, &d);
        let theirs: BatchNorm<B> = BatchNormConfig::new(c).init(&d);
        let w = Tensor::<B, 4>::random(dims, Distribution::Default, &d);
        let y1 = ours.forward(x.clone());
        let y2 = theirs.forward(x.clone());
        close(y1.to_data(), y2.to_data(), 1e-5, "output");
        let g1 = (y1 * w.clone()).sum().backward();
        let g2 = (y2 * w).sum().backward();
        close(
            x.grad(&g1).unwrap().to_data(),
            x.grad(&g2).unwrap().to_data(),
            1e-4,
            "input gradient",
        );
        close(
            ours.gamma.grad(&g1).unwrap().to_data(),
            theirs.gamma.grad(&g2).unwrap().to_data(),
            1e-4,
            "gamma gradient",
        );
        close(
            ours.beta.grad(&g1).unwrap().to_data(),
            theirs.beta.grad(&g2).unwrap().to_data(),
            1e-4,
            "beta gradient",
        );
        // Running statistics: the same mean; the variance unbiased, as PyTorch keeps it.
        // (Burn's `value_sync`: it keeps a thread's last update aside until read this way.)
        close(
            ours.running_mean.value().to_data(),
            theirs.running_mean.value_sync().to_data(),
            1e-5,
            "running mean",
        );
        let m = (dims[0] * dims[2] * dims[3]) as f32;
        let biased = theirs.running_var.value_sync();
        let unbiased_expected = (biased - 0.9) * (m / (m - 1.0)) + 0.9;
        close(
            ours.running_var.value().to_data(),
            unbiased_expected.to_data(),
            1e-4,
            "running variance",
        );
    }

    /// The runner's encoder (`encoder_forward`) is Burn's `TransformerEncoder::forward`
    /// with a padding mask: the same output and gradients (of the input and of the first
    /// layer's query and feed-forward weights), pre-norm and post-norm. Without dropout:
    /// Flex's dropout masks do not repeat after `B::seed` (Burn's encoder run twice so
    /// differs), so the dropouts are placed as Burn places them, by reading, not by test.
    #[test]
    fn transformer_encoder_matches_burns() {
        use burn::nn::transformer::TransformerEncoderInput;
        let device = Default::default();
        for norm_first in [true, false] {
            let encoder = TransformerEncoderConfig::new(8, 12, 2, 2)
                .with_dropout(0.0)
                .with_norm_first(norm_first)
                .init::<B>(&device);
            let x = Tensor::<B, 3>::random([3, 5, 8], Distribution::Normal(0., 1.), &device);
            let pad = Tensor::<B, 2, Int>::from_data(
                [[0, 0, 0, 0, 0], [0, 0, 0, 1, 1], [0, 1, 1, 1, 1]],
                &device,
            )
            .equal_elem(1);
            let dy = Tensor::<B, 3>::random([3, 5, 8], Distribution::Normal(0., 1.), &device);
            let run = |ours: bool| {
                let x = x.clone().require_grad();
                let y = match ours {
                    true => encoder_forward(&encoder, x.clone(), pad.clone()),
                    false => encoder
                        .forward(TransformerEncoderInput::new(x.clone()).mask_pad(pad.clone())),
                };
                let g = (y.clone() * dy.clone()).sum().backward();
                let layer = &encoder.layers[0];
                [
                    y.into_data(),
                    x.grad(&g).unwrap().into_data(),
                    layer.mha.query.weight.val().grad(&g).unwrap().into_data(),
                    layer
                        .pwff
                        .linear_inner
                        .weight
                        .val()
                        .grad(&g)
                        .unwrap()
                        .into_data(),
                ]
            };
            let (ours, theirs) = (run(true), run(false));
            for (name, (a, b)) in ["output", "dx", "dW query", "dW inner"]
                .iter()
                .zip(ours.into_iter().zip(theirs))
            {
                close(a, b, 1e-4, &format!("norm_first {norm_first}: {name}"));
            }
        }
    }

    /// The runner's LSTM (`lstm_forward`, its gates' products joined) is Burn's
    /// `Lstm::forward` from a zero state: the same output and gradients (of the input, of
    /// each gate's bias and of two gates' weights), forward and reversed, and with a
    /// coupled forget gate (`input_forget`), whose own weights then get no gradient in
    /// either.
    #[test]
    fn lstm_matches_burns() {
        let device = Default::default();
        for (reverse, coupled) in [(false, false), (true, false), (false, true)] {
            let lstm = LstmConfig::new(6, 5, true)
                .with_reverse(reverse)
                .with_input_forget(coupled)
                .init::<B>(&device);
            let x = Tensor::<B, 3>::random([3, 4, 6], Distribution::Normal(0., 1.), &device);
            let dy = Tensor::<B, 3>::random([3, 4, 5], Distribution::Normal(0., 1.), &device);
            let run = |ours: bool| {
                let x = x.clone().require_grad();
                let y = match ours {
                    true => lstm_forward(&lstm, x.clone()),
                    false => lstm.forward(x.clone(), None).0,
                };
                let g = (y.clone() * dy.clone()).sum().backward();
                let weight = |l: &Linear<B>| l.weight.val().grad(&g).map(|t| t.into_data());
                let bias = |l: &Linear<B>| {
                    (l.bias.as_ref()).and_then(|b| b.val().grad(&g).map(|t| t.into_data()))
                };
                let gates = [
                    &lstm.input_gate,
                    &lstm.forget_gate,
                    &lstm.output_gate,
                    &lstm.cell_gate,
                ];
                let mut out = vec![Some(y.into_data()), x.grad(&g).map(|t| t.into_data())];
                out.extend(gates.iter().map(|c| bias(&c.hidden_transform)));
                out.extend([
                    weight(&lstm.forget_gate.input_transform),
                    weight(&lstm.cell_gate.hidden_transform),
                ]);
                out
            };
            let (ours, theirs) = (run(true), run(false));
            let names = [
                "output",
                "dx",
                "db input",
                "db forget",
                "db output",
                "db cell",
                "dW forget (input)",
                "dW cell (hidden)",
            ];
            for (name, (a, b)) in names.iter().zip(ours.into_iter().zip(theirs)) {
                let what = format!("reverse {reverse}, coupled {coupled}: {name}");
                let forget = name.contains("forget");
                match (a, b) {
                    (Some(a), Some(b)) if !(coupled && forget) => close(a, b, 1e-5, &what),
                    (None, None) if coupled && forget => {}
                    (a, b) => panic!("{what}: ours {:?}, Burn's {:?}", a.is_some(), b.is_some()),
                }
            }
        }
    }
}
