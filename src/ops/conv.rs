//! The models' 2-D convolution (no bias) as a backend extension: [`ConvBackend`] has the
//! forward and the two gradients, with Burn's own kernels as the default. Flex overrides
//! them with [`super::conv_cpu`]'s im2col + gemm lowering; the autodiff backend records one
//! custom op whose backward calls the inner backend's two gradients; CUDA runs Burn's
//! kernels with the strategy `backend.conv` chose (`super::conv_cube`).
//!
//! Why not Burn's `conv2d` on Flex: burn-flex 0.21 overrides `conv2d` but neither
//! `conv2d_x_backward` nor `conv2d_weight_backward`, and Burn's generic fallbacks for those
//! were 2–30× PyTorch's per layer (issue 12; BENCHMARKS.md "CPU training").

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{ConvOptions, FloatTensor, ModuleOps};
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};

use super::conv_cpu as cpu;
use super::{to_flex, values};

/// A backend the models can convolve on. The defaults are Burn's kernels.
pub trait ConvBackend: Backend {
    /// `conv2d(x, weight)` without bias.
    fn conv2d_nobias(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        Self::conv2d(x, weight, None, options)
    }

    /// The loss's gradient with respect to `x`, from the output's gradient.
    fn conv2d_nobias_x_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        Self::conv2d_x_backward(x, weight, output_grad, options)
    }

    /// The loss's gradient with respect to the weight, from the output's gradient.
    fn conv2d_nobias_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        Self::conv2d_weight_backward(x, weight, output_grad, options)
    }

    /// A weight `[o, c, kh, kw]` with the same values, held in the memory layout this
    /// backend's convolutions read without a copy. The default keeps it as it is; CubeCL's
    /// backends hold a kernel larger than 1×1 channels-last ([`super::conv_cube`]).
    fn conv_weight_layout(weight: FloatTensor<Self>) -> FloatTensor<Self> {
        weight
    }
}

/// [`ConvBackend::conv_weight_layout`] of a model's weight, untracked (a layout, not a
/// computation: the model's weights are leaves, and the caller makes the result one).
pub fn conv_weight_layout<B: ConvBackend>(weight: Tensor<B, 4>) -> Tensor<B, 4> {
    let out = B::conv_weight_layout(weight.into_primitive().tensor());
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// `conv2d(x, weight)` without bias, on any [`ConvBackend`].
pub fn conv2d<B: ConvBackend>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 4>,
    options: ConvOptions<2>,
) -> Tensor<B, 4> {
    let out = B::conv2d_nobias(
        x.into_primitive().tensor(),
        weight.into_primitive().tensor(),
        options,
    );
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// The geometry of a convolution [`cpu`] handles: `f32` operands, one group, a non-empty
/// output. `None` leaves it to Burn's kernels.
pub(crate) fn cpu_geometry(
    x: &FlexTensor,
    weight: &FlexTensor,
    options: &ConvOptions<2>,
) -> Option<cpu::Geometry> {
    let dims = |t: &FlexTensor| -> Option<[usize; 4]> {
        if t.dtype() != DType::F32 {
            return None;
        }
        t.shape().as_slice().try_into().ok()
    };
    if options.groups != 1 {
        return None;
    }
    let (stride, padding, dilation) = (options.stride, options.padding, options.dilation);
    cpu::Geometry::new(dims(x)?, dims(weight)?, stride, padding, dilation)
}

impl ConvBackend for Flex {
    fn conv2d_nobias(x: FlexTensor, weight: FlexTensor, options: ConvOptions<2>) -> FlexTensor {
        match cpu_geometry(&x, &weight, &options) {
            Some(g) => {
                let (x, w) = (x.to_contiguous(), weight.to_contiguous());
                to_flex(
                    cpu::forward(&g, values(&x), values(&w)),
                    [g.n, g.co, g.ho, g.wo],
                )
            }
            None => Self::conv2d(x, weight, None, options),
        }
    }

    fn conv2d_nobias_x_backward(
        x: FlexTensor,
        weight: FlexTensor,
        output_grad: FlexTensor,
        options: ConvOptions<2>,
    ) -> FlexTensor {
        match cpu_geometry(&x, &weight, &options) {
            Some(g) if output_grad.dtype() == DType::F32 => {
                let (w, dy) = (weight.to_contiguous(), output_grad.to_contiguous());
                to_flex(
                    cpu::backward_x(&g, values(&w), values(&dy)),
                    [g.n, g.c, g.h, g.w],
                )
            }
            _ => Self::conv2d_x_backward(x, weight, output_grad, options),
        }
    }

    fn conv2d_nobias_weight_backward(
        x: FlexTensor,
        weight: FlexTensor,
        output_grad: FlexTensor,
        options: ConvOptions<2>,
    ) -> FlexTensor {
        match cpu_geometry(&x, &weight, &options) {
            Some(g) if output_grad.dtype() == DType::F32 => {
                let (x, dy) = (x.to_contiguous(), output_grad.to_contiguous());
                to_flex(
                    cpu::backward_weight(&g, values(&x), values(&dy)),
                    [g.co, g.c, g.kh, g.kw],
                )
            }
            _ => Self::conv2d_weight_backward(x, weight, output_grad, options),
        }
    }
}

/// One autodiff node per convolution; its backward asks the inner backend for the two
/// gradients of whichever operands are tracked.
impl<B: ConvBackend, C: CheckpointStrategy> ConvBackend for Autodiff<B, C> {
    /// The inner backend's layout, as a new untracked tensor.
    fn conv_weight_layout(weight: FloatTensor<Self>) -> FloatTensor<Self> {
        use burn::tensor::backend::AutodiffBackend;
        Self::from_inner(B::conv_weight_layout(Self::inner(weight)))
    }

    fn conv2d_nobias(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Conv2dBackward;

        impl<B: ConvBackend> Backward<B, 2> for Conv2dBackward {
            type State = (NodeId, NodeId, ConvOptions<2>);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                checkpointer: &mut Checkpointer,
            ) {
                let [node_x, node_weight] = ops.parents;
                let grad = grads.consume::<B>(&ops.node);
                let (x_state, weight_state, options) = ops.state;
                let x = checkpointer.retrieve_node_output::<FloatTensor<B>>(x_state);
                let weight = checkpointer.retrieve_node_output::<FloatTensor<B>>(weight_state);
                if let Some(node) = node_x {
                    let dx = B::conv2d_nobias_x_backward(
                        x.clone(),
                        weight.clone(),
                        grad.clone(),
                        options.clone(),
                    );
                    grads.register::<B>(node.id, dx);
                }
                if let Some(node) = node_weight {
                    let dw = B::conv2d_nobias_weight_backward(x, weight, grad, options);
                    grads.register::<B>(node.id, dw);
                }
            }
        }

        match Conv2dBackward
            .prepare::<C>([x.node.clone(), weight.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let x_state = prep.checkpoint(&x);
                let weight_state = prep.checkpoint(&weight);
                let out = B::conv2d_nobias(x.primitive, weight.primitive, options.clone());
                prep.finish((x_state, weight_state, options), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::conv2d_nobias(x.primitive, weight.primitive, options))
            }
        }
    }
}
