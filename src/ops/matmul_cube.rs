//! `backend.matmul` on CubeCL's backends (CUDA; WebGPU in the tests): the models' fully
//! connected layers ([`super::matmul`]) on one kernel chosen by the shape, with nothing
//! tuned (`fixed`, the default), or through Burn's `matmul`, autotuned (`autotune`). Owns
//! the process-wide choice and CubeCL's untuned matmul, which the convolutions' own
//! products (`conv_cube`) share.
//!
//! Why: Burn 0.21's `matmul` with its `autotune` feature compiles and times the candidates
//! of each new shape's highest-priority group (about ten on CUDA) before the step goes
//! on; fused, fusion's matmul does the same. A fully connected layer is three shapes, so a
//! cold first step compiled 33 kernels (stand-in driver, BENCHMARKS.md) for ResNet-50's
//! 2048 → 10 classifier, whose three products are 1.3 M multiply-adds each. Fixed, each shape compiles the one kernel CubeCL
//! picks without autotune (Burn's own choice when built without it): tensor-core tiles
//! where there are, else the unit kernel.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime};
use burn_fusion::Fusion;
use burn_ir::OperationOutput;
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::std::InputBinding;

use super::queued::queue;
use super::MatmulBackend;
use crate::plan::KernelPlan;
use crate::recipe::MatmulAlgo;

/// The float32 backends the runner builds on a CubeCL runtime.
type Cube<R, BT> = CubeBackend<R, f32, i32, BT>;

/// `backend.matmul = "fixed"` of the run that queues products now.
static FIXED: AtomicBool = AtomicBool::new(true);

/// Whether a refusal of the fixed kernel was said (once a process).
static REFUSAL_SAID: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// A test's own choice, on its thread only (the choice is process-wide otherwise).
    static FIXED_HERE: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Takes `backend.matmul` of the run that queues products now.
pub fn set(kernels: &KernelPlan) {
    FIXED.store(kernels.matmul == MatmulAlgo::Fixed, Ordering::Relaxed);
}

fn fixed() -> bool {
    FIXED_HERE
        .with(Cell::get)
        .unwrap_or_else(|| FIXED.load(Ordering::Relaxed))
}

/// `lhs · rhs` (`[.., m, k]` by `[.., k, n]`, in the layouts CubeCL's matmul takes: a
/// transposed view is read as it is) into a new contiguous tensor of shape `out`, by
/// CubeCL's own matmul without autotune: tensor cores where there are (Burn's default
/// choice, `Strategy::Auto`, whose fallback panics on what it does not expect), else its
/// unit kernel. `Err`: both refused.
pub(crate) fn matmul<R: CubeRuntime>(
    lhs: &CubeTensor<R>,
    rhs: &CubeTensor<R>,
    out: Shape,
) -> Result<CubeTensor<R>, String> {
    use cubek::matmul::launch::{launch_ref, Strategy as MatmulStrategy};
    let (client, dtype) = (lhs.client.clone(), lhs.dtype);
    let out = empty_device_dtype(client.clone(), lhs.device.clone(), out, dtype);
    let bind = |t: &CubeTensor<R>| InputBinding::new(t.clone().binding(), t.dtype.into());
    let launch = |strategy: &MatmulStrategy| {
        let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
            lhs: dtype.into(),
            rhs: dtype.into(),
            out: dtype.into(),
        });
        launch_ref(
            strategy,
            &client,
            bind(lhs),
            bind(rhs),
            out.clone().binding(),
            &mut dtypes,
        )
    };
    launch(&MatmulStrategy::SimpleCyclicCmma(Default::default()))
        .or_else(|_| launch(&MatmulStrategy::SimpleUnit(Default::default())))
        .map_err(|e| format!("{e:?}"))?;
    Ok(out)
}

/// `[m, k] · [k, n]` on the fixed kernel; where it refuses (said once a process) or the
/// operands are not two `f32` matrices of matching depth, Burn's autotuned `matmul`.
fn fixed_2d<R: CubeRuntime, BT: BoolElement>(
    lhs: CubeTensor<R>,
    rhs: CubeTensor<R>,
) -> CubeTensor<R> {
    use burn::tensor::ops::FloatTensorOps;
    let (ls, rs) = (lhs.shape(), rhs.shape());
    let takes = ls.num_dims() == 2
        && rs.num_dims() == 2
        && ls[1] == rs[0]
        && lhs.dtype == DType::F32
        && rhs.dtype == DType::F32;
    if takes {
        match matmul(&lhs, &rhs, Shape::new([ls[0], rs[1]])) {
            Ok(out) => {
                #[cfg(test)]
                tests::note([ls[0], ls[1]], [rs[0], rs[1]]);
                return out;
            }
            Err(e) if !REFUSAL_SAID.swap(true, Ordering::Relaxed) => eprintln!(
                "note: backend.matmul = \"fixed\": CubeCL's matmul refused [{}, {}] by [{}, {}] ({e}); Burn's autotuned matmul takes what it refuses",
                ls[0], ls[1], rs[0], rs[1]
            ),
            Err(_) => {}
        }
    }
    Cube::<R, BT>::float_matmul(lhs, rhs)
}

impl<R: CubeRuntime, BT: BoolElement> MatmulBackend for Cube<R, BT> {
    fn matmul_2d(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        use burn::tensor::ops::FloatTensorOps;
        if !fixed() {
            return Self::float_matmul(lhs, rhs);
        }
        fixed_2d::<R, BT>(lhs, rhs)
    }
}

impl<R: CubeRuntime, BT: BoolElement> MatmulBackend for Fusion<Cube<R, BT>> {
    /// Fixed: queued, a custom operation (fusion's own matmul would tune its candidates).
    fn matmul_2d(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        use burn::tensor::ops::FloatTensorOps;
        let (ls, rs) = (lhs.shape.clone(), rhs.shape.clone());
        if !fixed() || ls.num_dims() != 2 || rs.num_dims() != 2 {
            return Self::float_matmul(lhs, rhs);
        }
        let out = (Shape::new([ls[0], rs[1]]), lhs.dtype);
        let run = |t: Vec<CubeTensor<R>>| {
            let mut t = t.into_iter();
            match (t.next(), t.next()) {
                (Some(lhs), Some(rhs)) => vec![fixed_2d::<R, BT>(lhs, rhs)],
                _ => vec![],
            }
        };
        queue::<R, BT, _>("runner_matmul_fixed", vec![lhs, rhs], &[out], run).output()
    }
}

/// The fully connected layer on a real CubeCL runtime (WebGPU on Mesa's software Vulkan,
/// fused and not; CUDA where the GPU check's self-test runs it), against the CPU: which
/// products the fixed kernel ran, and their values.
#[cfg(all(test, any(feature = "wgpu", feature = "cuda")))]
pub(crate) mod tests {
    use std::sync::Mutex;

    use burn::backend::{Autodiff, Flex};
    use burn::module::Param;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::backend::Backend;
    use burn::tensor::{Distribution, Tensor, TensorData};

    use super::*;
    use crate::ops::{linear, TrainBackend};

    /// The products the fixed kernel ran, by their operands' shapes.
    static RAN: Mutex<Vec<([usize; 2], [usize; 2])>> = Mutex::new(Vec::new());

    pub(super) fn note(lhs: [usize; 2], rhs: [usize; 2]) {
        RAN.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((lhs, rhs));
    }

    fn ran(of: &[([usize; 2], [usize; 2])]) -> Vec<([usize; 2], [usize; 2])> {
        let ran = RAN.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = ran.iter().filter(|p| of.contains(p)).copied().collect();
        out.sort();
        out
    }

    /// (output, dx, dW, db) of `sum(linear(x) * dy)` with the layer's values given.
    fn layer_and_grads<B: TrainBackend>(
        layer: &Linear<Flex>,
        x: &TensorData,
        dy: &TensorData,
        fixed: bool,
    ) -> [Vec<f32>; 4] {
        let device = Default::default();
        let param = |d: TensorData| Param::from_tensor(Tensor::from_data(d, &device));
        let layer: Linear<B> = Linear {
            weight: param(layer.weight.val().into_data()),
            bias: (layer.bias.as_ref()).map(|b| param_1d::<B>(b.val().into_data(), &device)),
        };
        let x = Tensor::<B, 2>::from_data(x.clone(), &device).require_grad();
        let dy = Tensor::<B, 2>::from_data(dy.clone(), &device);
        FIXED_HERE.with(|c| c.set(Some(fixed)));
        let y = linear(&layer, x.clone());
        let grads = (y.clone() * dy).sum().backward();
        let values = |d: TensorData| d.to_vec::<f32>().unwrap();
        let out = [
            values(y.into_data()),
            values(x.grad(&grads).unwrap().into_data()),
            values(layer.weight.val().grad(&grads).unwrap().into_data()),
            values(
                layer
                    .bias
                    .as_ref()
                    .unwrap()
                    .val()
                    .grad(&grads)
                    .unwrap()
                    .into_data(),
            ),
        ];
        FIXED_HERE.with(|c| c.set(None));
        out
    }

    fn param_1d<B: Backend>(d: TensorData, device: &B::Device) -> Param<Tensor<B, 1>> {
        Param::from_tensor(Tensor::from_data(d, device))
    }

    fn random(dims: [usize; 2]) -> TensorData {
        Tensor::<Flex, 2>::random(dims, Distribution::Normal(0.0, 1.0), &Default::default())
            .into_data()
    }

    /// Fused and plain: with `fixed`, the forward product and both gradients' ran on the
    /// fixed kernel (`[m, k]·[k, n]`, `[m, n]·[n, k]`, `[k, m]·[m, n]`), with `autotune`
    /// none did; either way every value is the CPU's. The shapes are this test's own.
    pub(crate) fn fixed_products_match_the_cpu<F: TrainBackend, P: TrainBackend>() {
        let (m, k, n) = (19, 37, 11);
        let layer = LinearConfig::new(k, n).init::<Flex>(&Default::default());
        let (x, dy) = (random([m, k]), random([m, n]));
        let want = layer_and_grads::<Autodiff<Flex>>(&layer, &x, &dy, true);
        let products = [([m, k], [k, n]), ([m, n], [n, k]), ([k, m], [m, n])];
        let mut expected = products.to_vec();
        expected.sort();
        for (backend, fixed) in [
            ("fused", true),
            ("plain", true),
            ("fused", false),
            ("plain", false),
        ] {
            RAN.lock().unwrap_or_else(|e| e.into_inner()).clear();
            let got = match backend {
                "fused" => layer_and_grads::<F>(&layer, &x, &dy, fixed),
                _ => layer_and_grads::<P>(&layer, &x, &dy, fixed),
            };
            let what = format!("{backend}, fixed {fixed}");
            for (name, (g, w)) in ["output", "dx", "dW", "db"]
                .iter()
                .zip(got.iter().zip(&want))
            {
                assert_eq!(g.len(), w.len(), "{what}: {name}");
                let worst = g
                    .iter()
                    .zip(w)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                // (TF32 tensor cores on CUDA: 10 bits of mantissa, sums of 37 products.)
                assert!(worst < 2e-2, "{what}: {name} differs by {worst}");
            }
            let want_ran = if fixed { expected.clone() } else { vec![] };
            assert_eq!(
                ran(&products),
                want_ran,
                "{what}: the products the fixed kernel ran"
            );
        }
    }

    #[cfg(feature = "wgpu")]
    #[test]
    fn wgpu_fixed_products_match_the_cpu() {
        fixed_products_match_the_cpu::<
            Autodiff<burn::backend::Wgpu>,
            Autodiff<CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u32>>,
        >();
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_named_fixed_products_match_the_cpu() {
        if !crate::backend::cuda_devices().is_ok_and(|d| !d.is_empty()) {
            eprintln!("no CUDA device here: the fixed matmul is not checked");
            return;
        }
        fixed_products_match_the_cpu::<
            Autodiff<burn::backend::Cuda>,
            Autodiff<CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>>,
        >();
    }
}
