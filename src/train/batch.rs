//! Batches from host to device: what the loader's workers build (images augmented and
//! normalised, or bytes for normalisation on the device; text padded) and the tensors the
//! step gets.

use super::*;
use crate::plan::DataSource;

/// A batch as the loader's workers prepare it: host tensors, staged for the copy if asked.
pub struct HostBatch {
    pub(crate) input: HostInput,
    pub(crate) labels: TensorData,
    /// Text: real and padded token positions.
    pub(crate) tokens: Option<(usize, usize)>,
}

/// A batch's inputs: one per batch in flight, so the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum HostInput {
    Images(TensorData),
    Tokens {
        ids: TensorData,
        pad: TensorData,
        lengths: TensorData,
    },
}

impl HostBatch {
    pub(crate) fn data_mut(&mut self) -> Vec<&mut TensorData> {
        let mut v = vec![&mut self.labels];
        match &mut self.input {
            HostInput::Images(x) => v.push(x),
            HostInput::Tokens { ids, pad, lengths } => v.extend([ids, pad, lengths]),
        }
        v
    }
}

/// How a plan's batches are made on the host (by the loader's workers) and finished on
/// the device: images are augmented and normalised on the host or copied as bytes and
/// normalised on the device; text is padded by the plan's strategy.
#[derive(Debug, Clone)]
pub struct Batcher {
    pub collate: Collate,
    /// Per-channel `(scale, shift)` applied on the device to bytes; `None` for text or host
    /// normalisation.
    pub device_affine: Option<Vec<(f32, f32)>>,
    pub shape: Shape,
}

impl Batcher {
    pub fn new(plan: &Plan, vocab: usize) -> Self {
        let d = match &plan.data.source {
            DataSource::Cifar { image, .. } | DataSource::Synthetic { image, .. } => image,
            DataSource::Jsonl { text: t, .. } => {
                return Self {
                    collate: Collate::Text(t.padding.clone()),
                    device_affine: None,
                    shape: Shape::Text {
                        vocab,
                        max_len: t.padding.max_row_len(),
                    },
                };
            }
        };
        let n = &d.normalize;
        let affine = Prepare::affine(&n.mean, &n.std);
        let on_host = n.on == NormalizeOn::Host;
        Self {
            collate: Collate::Images(Prepare {
                crop_padding: d.crop_padding,
                hflip: d.hflip,
                host_affine: on_host.then(|| affine.clone()),
                seed: plan.seed,
            }),
            device_affine: (!on_host).then_some(affine),
            shape: Shape::Image {
                channels: d.channels,
                side: d.height,
            },
        }
    }

    /// The host batch of these samples.
    pub fn host(&self, data: &Dataset, indices: &[usize], epoch: usize, train: bool) -> HostBatch {
        let labels: Vec<i32> = indices.iter().map(|&i| data.labels()[i] as i32).collect();
        let n = labels.len();
        let labels = TensorData::new(labels, [n]);
        match self.collate.batch(data, indices, epoch, train) {
            HostData::Pixels(p) => {
                let Shape::Image { channels, side } = self.shape else {
                    unreachable!("image batcher")
                };
                let shape = [n, channels, side, side];
                let images = match p {
                    Pixels::F32(v) => TensorData::new(v, shape),
                    Pixels::U8(v) => TensorData::new(v, shape),
                };
                HostBatch {
                    input: HostInput::Images(images),
                    labels,
                    tokens: None,
                }
            }
            HostData::Tokens(t) => {
                let pad: Vec<bool> = t
                    .lengths
                    .iter()
                    .flat_map(|&l| (0..t.len).map(move |j| j >= l))
                    .collect();
                let tokens = Some((t.real_tokens(), t.padded_tokens()));
                let lengths: Vec<i32> = t.lengths.iter().map(|&l| l as i32).collect();
                HostBatch {
                    input: HostInput::Tokens {
                        ids: TensorData::new(t.ids, [n, t.len]),
                        pad: TensorData::new(pad, [n, t.len]),
                        lengths: TensorData::new(lengths, [n]),
                    },
                    labels,
                    tokens,
                }
            }
        }
    }

    /// What decides a batch's tensor shapes: its size, and for text its padded row length.
    pub fn shape_of(&self, data: &Dataset, indices: &[usize]) -> (usize, usize) {
        match (&self.collate, data) {
            (Collate::Text(padding), Dataset::Text(set)) => {
                let longest = indices.iter().map(|&i| set.seqs[i].len()).max();
                (indices.len(), padding.row_len(longest.unwrap_or(0)))
            }
            _ => (indices.len(), 0),
        }
    }

    /// Host batch → device tensors. Bytes are cast and normalised on the device.
    pub fn to_device<B: Backend>(
        &self,
        b: HostBatch,
        device: &B::Device,
    ) -> (Input<B>, Tensor<B, 1, Int>) {
        let labels = Tensor::<B, 1, Int>::from_data(b.labels, device);
        let input = match b.input {
            HostInput::Images(x) if x.dtype == DType::U8 => {
                let [n, c, h, w] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
                let (scale, shift): (Vec<f32>, Vec<f32>) = match &self.device_affine {
                    Some(a) => a.iter().copied().unzip(),
                    None => (vec![1.0 / 255.0; c], vec![0.0; c]),
                };
                // One (scale, shift) per image plane, as `[n·c, 1]` columns: a per-row
                // multiply-add, which the CPU backend runs with SIMD (a `[1, c, 1, 1]`
                // broadcast it walks element by element) and CUDA fuses the same.
                let rows = |v: &[f32]| {
                    let col: Vec<f32> = (0..n).flat_map(|_| v.iter().copied()).collect();
                    Tensor::<B, 2>::from_data(TensorData::new(col, [n * c, 1]), device)
                };
                let bytes = Tensor::<B, 4, Int>::from_data(x, (device, DType::U8))
                    .float()
                    .reshape([n * c, h * w]);
                Input::Images((bytes * rows(&scale) + rows(&shift)).reshape([n, c, h, w]))
            }
            HostInput::Images(x) => Input::Images(Tensor::<B, 4>::from_data(x, device)),
            HostInput::Tokens { ids, pad, lengths } => Input::Tokens {
                ids: Tensor::<B, 2, Int>::from_data(ids, device),
                pad: Tensor::<B, 2, Bool>::from_data(pad, device),
                lengths: Tensor::<B, 1, Int>::from_data(lengths, device),
            },
        };
        (input, labels)
    }
}
