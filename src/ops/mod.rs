//! The operations the models call whose CPU implementation is the runner's own: the 2-D
//! convolution ([`conv`]), training-mode batch normalisation with the residual add and
//! ReLU after it ([`norm`]), the optimizers' updates ([`optim`]), and the masked mean and max pooling ([`pool`]). Each is a Burn
//! backend extension, the route of Burn's "custom kernel" examples: a trait with Burn's
//! kernels as the default, an override for the CPU backend (Flex), and an impl for the
//! autodiff backend that records one custom op whose backward calls the inner backend.
//! CUDA keeps Burn's kernels, with the convolution strategy `backend.conv` chose, or runs
//! kernels of the runner's (`*_cube`). The fully connected layers' product ([`matmul`])
//! is one the other way round: the CPU keeps Burn's, CUDA runs it untuned. No
//! change to Burn; the cost is a bound ([`ModelBackend`], [`TrainBackend`]) that the model
//! and the training loop carry.
//!
//! Measured on a ResNet-18 step (issue 12): Flex ran Burn's generic convolution gradients
//! at 2–30× PyTorch's per layer, and a batch norm composed of a dozen whole-tensor ops
//! (each a pass over memory, forward and backward) cost about a fifth of the step. Flex
//! runs elementwise ops on one thread, so on two cores every separate pass that remained
//! (ReLU, residual add, the optimizer's) cost twice what a parallel one would.

pub mod conv;
pub mod conv_cpu;
#[cfg(feature = "cube")]
pub mod conv_cube;
pub mod matmul;
#[cfg(feature = "cube")]
pub mod matmul_cube;
pub mod norm;
#[cfg(feature = "cube")]
mod norm_apply_cube;
#[cfg(feature = "cube")]
pub mod norm_cube;
pub mod optim;
#[cfg(feature = "cube")]
mod optim_cube;
mod patches;
#[cfg(feature = "cube")]
mod patches_cube;
pub mod pool;
#[cfg(feature = "cube")]
mod queued;
mod winograd;

#[cfg(test)]
mod conv_tests;

use burn::backend::flex::FlexTensor;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, TensorData, TensorMetadata};

pub use conv::{conv2d, conv_weight_layout, ConvBackend};
pub use matmul::{linear, linear_3d, matmul, MatmulBackend};
pub use norm::{
    batch_norm_eval, batch_norm_running, batch_norm_train, batch_norm_train_act, NormBackend,
};
pub use optim::OptimBackend;
pub use pool::{masked_mean, max_pool2d, PoolBackend};

/// What the models need of a backend.
pub trait ModelBackend: ConvBackend + MatmulBackend + NormBackend + PoolBackend {}

impl<B: ConvBackend + MatmulBackend + NormBackend + PoolBackend> ModelBackend for B {}

/// What the training loop needs of a backend: autodiff, and the models' operations on both
/// it and the inner (evaluation) backend.
pub trait TrainBackend:
    AutodiffBackend<InnerBackend: ModelBackend + OptimBackend> + ModelBackend
{
}

impl<B> TrainBackend for B where
    B: AutodiffBackend<InnerBackend: ModelBackend + OptimBackend> + ModelBackend
{
}

/// `t` as a contiguous `f32` tensor with its dimensions, where it is one of rank `D`.
fn flex_f32<const D: usize>(t: &FlexTensor) -> Option<(FlexTensor, [usize; D])> {
    let dims: [usize; D] = t.shape().as_slice().try_into().ok()?;
    (t.dtype() == DType::F32).then(|| (t.to_contiguous(), dims))
}

/// The values of a tensor made by [`flex_f32`].
fn values(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>()
        .expect("flex_f32 made it contiguous f32")
}

fn to_flex<const D: usize>(values: Vec<f32>, shape: [usize; D]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape))
}
