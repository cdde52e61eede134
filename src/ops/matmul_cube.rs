//! `backend.matmul` on CubeCL's backends (CUDA; WebGPU in the tests): the models' products
//! (fully connected layers and attention, [`super::matmul`]) on one kernel chosen by the
//! shape, with nothing tuned (`fixed`, the default), or through Burn's `matmul`, autotuned
//! (`autotune`). Owns
//! the process-wide choice and CubeCL's untuned matmul, which the convolutions' own
//! products (`conv_cube`) share.
//!
//! Why: Burn 0.21's `matmul` with its `autotune` feature compiles and times the candidates
//! of each new shape's highest-priority group (about ten on CUDA) before the step goes
//! on; fused, fusion's matmul does the same. A fully connected layer is three shapes, so a
//! cold first step compiled 33 kernels (stand-in driver, BENCHMARKS.md) for ResNet-50's
//! 2048 → 10 classifier, whose three products are 1.3 M multiply-adds each. Fixed, each
//! shape compiles the one kernel CubeCL picks without autotune (Burn's own choice when
//! built without it): tensor-core tiles where there are, else the unit kernel.

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

fn use_fixed() -> bool {
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

/// The output shape of `lhs · rhs` where the fixed kernel takes them: `f32` (the runner's
/// models), ranks of at least 2, the same batch dimensions, and matching depths.
fn fixed_shape(lhs: &Shape, rhs: &Shape, dtypes: [DType; 2]) -> Option<Shape> {
    let (l, r) = (lhs.as_slice(), rhs.as_slice());
    let n = l.len();
    let takes = n >= 2
        && r.len() == n
        && l[..n - 2] == r[..n - 2]
        && l[n - 1] == r[n - 2]
        && dtypes == [DType::F32; 2];
    takes.then(|| {
        let mut out = l.to_vec();
        out[n - 1] = r[n - 1];
        Shape::from(out)
    })
}

/// `lhs · rhs` on the fixed kernel; where it refuses (said once a process) or the operands
/// are not what it takes ([`fixed_shape`]), Burn's autotuned `matmul`.
fn fixed<R: CubeRuntime, BT: BoolElement>(lhs: CubeTensor<R>, rhs: CubeTensor<R>) -> CubeTensor<R> {
    use burn::tensor::ops::FloatTensorOps;
    let (ls, rs) = (lhs.shape(), rhs.shape());
    if let Some(out) = fixed_shape(&ls, &rs, [lhs.dtype, rhs.dtype]) {
        match matmul(&lhs, &rhs, out) {
            Ok(out) => {
                #[cfg(test)]
                tests::note(ls.as_slice().to_vec(), rs.as_slice().to_vec());
                return out;
            }
            Err(e) if !REFUSAL_SAID.swap(true, Ordering::Relaxed) => eprintln!(
                "note: backend.matmul = \"fixed\": CubeCL's matmul refused {:?} by {:?} ({e}); Burn's autotuned matmul takes what it refuses",
                ls.as_slice(),
                rs.as_slice()
            ),
            Err(_) => {}
        }
    }
    Cube::<R, BT>::float_matmul(lhs, rhs)
}

impl<R: CubeRuntime, BT: BoolElement> MatmulBackend for Cube<R, BT> {
    fn layer_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        use burn::tensor::ops::FloatTensorOps;
        if !use_fixed() {
            return Self::float_matmul(lhs, rhs);
        }
        fixed::<R, BT>(lhs, rhs)
    }
}

impl<R: CubeRuntime, BT: BoolElement> MatmulBackend for Fusion<Cube<R, BT>> {
    /// Fixed: queued, a custom operation (fusion's own matmul would tune its candidates).
    fn layer_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        use burn::tensor::ops::FloatTensorOps;
        let out = fixed_shape(&lhs.shape, &rhs.shape, [lhs.dtype, rhs.dtype]);
        let Some(out) = out.filter(|_| use_fixed()) else {
            return Self::float_matmul(lhs, rhs);
        };
        let run = |t: Vec<CubeTensor<R>>| {
            let mut t = t.into_iter();
            match (t.next(), t.next()) {
                (Some(lhs), Some(rhs)) => vec![fixed::<R, BT>(lhs, rhs)],
                _ => vec![],
            }
        };
        let dtype = lhs.dtype;
        queue::<R, BT, _>("runner_matmul_fixed", vec![lhs, rhs], &[(out, dtype)], run).output()
    }
}

/// The products on a real CubeCL runtime (WebGPU on Mesa's software Vulkan, fused and not;
/// CUDA where the GPU check's self-test runs it), against the CPU: which products the
/// fixed kernel ran, and their values.
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
    static RAN: Mutex<Vec<Product>> = Mutex::new(Vec::new());

    /// A product by its operands' shapes.
    type Product = (Vec<usize>, Vec<usize>);

    pub(super) fn note(lhs: Vec<usize>, rhs: Vec<usize>) {
        RAN.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((lhs, rhs));
    }

    fn ran(of: &[Product]) -> Vec<Product> {
        let ran = RAN.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = ran.iter().filter(|p| of.contains(p)).cloned().collect();
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

    /// (output, da, db) of `sum(matmul(a, b) * dy)`, batched `[2, m, k]` by `[2, k, n]`.
    fn batched_and_grads<B: TrainBackend>(
        a: &TensorData,
        b: &TensorData,
        dy: &TensorData,
        fixed: bool,
    ) -> [Vec<f32>; 3] {
        let device = Default::default();
        let a = Tensor::<B, 3>::from_data(a.clone(), &device).require_grad();
        let b = Tensor::<B, 3>::from_data(b.clone(), &device).require_grad();
        let dy = Tensor::<B, 3>::from_data(dy.clone(), &device);
        FIXED_HERE.with(|c| c.set(Some(fixed)));
        let y = crate::ops::matmul(a.clone(), b.clone());
        let grads = (y.clone() * dy).sum().backward();
        let values = |d: TensorData| d.to_vec::<f32>().unwrap();
        let out = [
            values(y.into_data()),
            values(a.grad(&grads).unwrap().into_data()),
            values(b.grad(&grads).unwrap().into_data()),
        ];
        FIXED_HERE.with(|c| c.set(None));
        out
    }

    fn random_3d(dims: [usize; 3]) -> TensorData {
        Tensor::<Flex, 3>::random(dims, Distribution::Normal(0.0, 1.0), &Default::default())
            .into_data()
    }

    fn random(dims: [usize; 2]) -> TensorData {
        Tensor::<Flex, 2>::random(dims, Distribution::Normal(0.0, 1.0), &Default::default())
            .into_data()
    }

    /// Fused and plain: with `fixed`, a layer's forward product and both gradients' ran on
    /// the fixed kernel (`[m, k]·[k, n]`, `[m, n]·[n, k]`, `[k, m]·[m, n]`), and so did a
    /// batched product's (as attention's), with `autotune` none did; either way every value
    /// is the CPU's. The shapes are this test's own.
    pub(crate) fn fixed_products_match_the_cpu<F: TrainBackend, P: TrainBackend>() {
        let (m, k, n) = (19, 37, 11);
        let layer = LinearConfig::new(k, n).init::<Flex>(&Default::default());
        let (x, dy) = (random([m, k]), random([m, n]));
        let want = layer_and_grads::<Autodiff<Flex>>(&layer, &x, &dy, true);
        let products = [
            (vec![m, k], vec![k, n]),
            (vec![m, n], vec![n, k]),
            (vec![k, m], vec![m, n]),
        ];
        // Batched, as attention's: `[2, m, k] · [2, k, n]` and its two gradients.
        let (a, b, dz) = (
            random_3d([2, 6, 9]),
            random_3d([2, 9, 5]),
            random_3d([2, 6, 5]),
        );
        let want_batched = batched_and_grads::<Autodiff<Flex>>(&a, &b, &dz, true);
        let products = [
            products.to_vec(),
            vec![
                (vec![2, 6, 9], vec![2, 9, 5]),
                (vec![2, 6, 5], vec![2, 5, 9]),
                (vec![2, 9, 6], vec![2, 6, 5]),
            ],
        ]
        .concat();
        let mut expected = products.to_vec();
        expected.sort();
        for (backend, fixed) in [
            ("fused", true),
            ("plain", true),
            ("fused", false),
            ("plain", false),
        ] {
            RAN.lock().unwrap_or_else(|e| e.into_inner()).clear();
            let (got, got_batched) = match backend {
                "fused" => (
                    layer_and_grads::<F>(&layer, &x, &dy, fixed),
                    batched_and_grads::<F>(&a, &b, &dz, fixed),
                ),
                _ => (
                    layer_and_grads::<P>(&layer, &x, &dy, fixed),
                    batched_and_grads::<P>(&a, &b, &dz, fixed),
                ),
            };
            let what = format!("{backend}, fixed {fixed}");
            let names = ["output", "dx", "dW", "db", "batched", "da", "db (batched)"];
            for (name, (g, w)) in names.iter().zip(
                got.iter()
                    .chain(&got_batched)
                    .zip(want.iter().chain(&want_batched)),
            ) {
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
