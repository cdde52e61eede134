//! The models' products as a backend extension: [`MatmulBackend`] has the matrix product
//! a fully connected layer computes (`x · W`, and its two gradients `dy · Wᵀ` and
//! `xᵀ · dy`), batched too, as attention's (`model::encoder_forward`; the LSTM's gates
//! are layers too, `model::lstm_forward`),
//! with Burn's `matmul` as the default; the autodiff backend records one custom op whose
//! backward asks the inner backend for both gradients; CubeCL's backends run it on one
//! kernel chosen by the shape, untuned, unless `backend.matmul = "autotune"`
//! (`super::matmul_cube`). The CPU keeps Burn's (Flex's gemm).
//!
//! Why: Burn's `Linear` calls the backend's `matmul`, which on CUDA with Burn's `autotune`
//! feature compiles and times every candidate kernel of each new shape before the step
//! goes on, and a layer has three shapes (forward and two gradients). Counted behind the
//! stand-in driver (BENCHMARKS.md): of the MLP's 95 cold compilations, 47 were its
//! layers' matmul kernels (19.5 s of NVRTC), and ResNet-50's classifier alone took 33.
//! Fixed, the MLP compiles 5 and the classifier 3.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::backend::Flex;
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

/// A backend the models' layers multiply on. The default is Burn's.
pub trait MatmulBackend: Backend {
    /// `lhs · rhs`, `[.., m, k]` by `[.., k, n]` with the same batch dimensions (either
    /// may be a transposed or permuted view).
    fn layer_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(lhs, rhs)
    }
}

impl MatmulBackend for Flex {}

/// `lhs · rhs` by [`MatmulBackend::layer_matmul`]: `[.., m, k]` by `[.., k, n]`, the same
/// batch dimensions.
pub fn matmul<B: MatmulBackend, const D: usize>(
    lhs: Tensor<B, D>,
    rhs: Tensor<B, D>,
) -> Tensor<B, D> {
    let out = B::layer_matmul(lhs.into_primitive().tensor(), rhs.into_primitive().tensor());
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// A fully connected layer on `[batch, d_input]`: `x · W + b`, as Burn's `Linear::forward`,
/// its product by [`matmul`].
pub fn linear<B: MatmulBackend>(layer: &Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    let out = matmul(x, layer.weight.val());
    match &layer.bias {
        Some(b) => out + b.val().unsqueeze::<2>(),
        None => out,
    }
}

/// [`linear`] on `[batch, length, d_input]`, as rows.
pub fn linear_3d<B: MatmulBackend>(layer: &Linear<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    let [b, t, d] = x.dims();
    let out = linear(layer, x.reshape([b * t, d]));
    let n = out.dims()[1];
    out.reshape([b, t, n])
}

/// The last two dimensions of `t` swapped (a view).
fn transposed<B: Backend>(t: FloatTensor<B>) -> FloatTensor<B> {
    use burn::tensor::TensorMetadata;
    let n = t.shape().num_dims();
    B::float_swap_dims(t, n - 2, n - 1)
}

/// One autodiff node per product; its backward asks the inner backend for the gradients
/// of whichever operands are tracked, each a product too.
impl<B: MatmulBackend, C: CheckpointStrategy> MatmulBackend for Autodiff<B, C> {
    fn layer_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct MatmulBackward;

        impl<B: MatmulBackend> Backward<B, 2> for MatmulBackward {
            type State = (NodeId, NodeId);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                checkpointer: &mut Checkpointer,
            ) {
                let [node_lhs, node_rhs] = ops.parents;
                let grad = grads.consume::<B>(&ops.node);
                let (lhs_state, rhs_state) = ops.state;
                if let Some(node) = node_lhs {
                    let rhs = checkpointer.retrieve_node_output::<FloatTensor<B>>(rhs_state);
                    let d = B::layer_matmul(grad.clone(), transposed::<B>(rhs));
                    grads.register::<B>(node.id, d);
                }
                if let Some(node) = node_rhs {
                    let lhs = checkpointer.retrieve_node_output::<FloatTensor<B>>(lhs_state);
                    let d = B::layer_matmul(transposed::<B>(lhs), grad);
                    grads.register::<B>(node.id, d);
                }
            }
        }

        match MatmulBackward
            .prepare::<C>([lhs.node.clone(), rhs.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let lhs_state = prep.checkpoint(&lhs);
                let rhs_state = prep.checkpoint(&rhs);
                let out = B::layer_matmul(lhs.primitive, rhs.primitive);
                prep.finish((lhs_state, rhs_state), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::layer_matmul(lhs.primitive, rhs.primitive)),
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::nn::LinearConfig;
    use burn::tensor::{Distribution, TensorData};

    use super::*;

    type B = Autodiff<Flex>;

    fn worst(a: TensorData, b: TensorData) -> f32 {
        let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    /// The layer's output and the gradients of its input, weight and bias equal Burn's
    /// `Linear::forward`'s, with and without bias, for a square and a non-square weight
    /// (a transposed operand taken the wrong way round shows in either).
    #[test]
    fn linear_matches_burns_in_output_and_gradients() {
        let device = Default::default();
        for (m, k, n, bias) in [(5, 7, 3, true), (4, 6, 6, false), (1, 3, 8, true)] {
            let layer = LinearConfig::new(k, n).with_bias(bias).init::<B>(&device);
            let x = Tensor::<B, 2>::random([m, k], Distribution::Normal(0., 1.), &device);
            let dy = Tensor::<B, 2>::random([m, n], Distribution::Normal(0., 1.), &device);
            let grads = |y: Tensor<B, 2>, x: &Tensor<B, 2>| {
                let g = (y.clone() * dy.clone()).sum().backward();
                let b = layer
                    .bias
                    .as_ref()
                    .map(|b| b.val().grad(&g).unwrap().into_data());
                (
                    y.into_data(),
                    x.grad(&g).unwrap().into_data(),
                    layer.weight.val().grad(&g).unwrap().into_data(),
                    b,
                )
            };
            let ours = {
                let x = x.clone().require_grad();
                grads(linear(&layer, x.clone()), &x)
            };
            let burns = {
                let x = x.clone().require_grad();
                grads(layer.forward(x.clone()), &x)
            };
            let what = format!("[{m}, {k}] by [{k}, {n}], bias {bias}");
            assert!(worst(ours.0, burns.0) < 1e-5, "{what}: output");
            assert!(worst(ours.1, burns.1) < 1e-5, "{what}: input gradient");
            assert!(worst(ours.2, burns.2) < 1e-5, "{what}: weight gradient");
            match (ours.3, burns.3) {
                (Some(a), Some(b)) => assert!(worst(a, b) < 1e-5, "{what}: bias gradient"),
                (None, None) => {}
                _ => panic!("{what}: bias"),
            }
        }
    }
}
