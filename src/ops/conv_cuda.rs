//! `backend.conv` on CUDA: the models' convolution through Burn's autotuned kernels (the
//! default), or through one implicit-GEMM kernel per convolution and gradient with nothing
//! tuned (`implicit_gemm`). Owns the process-wide choice and the record of shapes the
//! implicit GEMM refused; it does not configure CubeCL (`kernels` does).
//!
//! Why: burn-cubecl's `conv2d` always takes `ConvStrategy::default()`, which with the
//! `autotune` feature compiles and times every candidate kernel of each new convolution
//! shape before the step goes on: up to 477 kernels for ResNet-50's first step at batch
//! 64 (BENCHMARKS.md, "Start-up"). Burn exposes the strategy only on its kernel functions,
//! so the runner calls them itself: on the plain CubeCL backend directly, and through a
//! custom fusion operation on the fused one (Burn's own `conv2d` there would call the
//! inner backend's default again).

use std::collections::HashSet;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use burn::tensor::ops::conv::calculate_conv_output_size;
use burn::tensor::ops::{ConvOptions, FloatTensor, ModuleOps};
use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::kernel::conv::{
    conv_data_backward, conv_forward, conv_weight_backward, ConvStrategy,
};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, OperationOutput, TensorIr};

use super::ConvBackend;
use crate::recipe::ConvAlgo;

type Cube = burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;

static IMPLICIT_GEMM: AtomicBool = AtomicBool::new(false);

/// Sets `backend.conv` for the convolutions launched from now on (each run sets its own).
pub fn set(algo: ConvAlgo) {
    IMPLICIT_GEMM.store(algo == ConvAlgo::ImplicitGemm, Ordering::Relaxed);
}

fn implicit_gemm() -> bool {
    IMPLICIT_GEMM.load(Ordering::Relaxed)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Pass {
    Forward,
    InputGrad,
    WeightGrad,
}

impl Pass {
    fn name(self) -> &'static str {
        match self {
            Pass::Forward => "forward pass",
            Pass::InputGrad => "input gradient",
            Pass::WeightGrad => "weight gradient",
        }
    }
}

/// A convolution as the implicit GEMM sees it: the pass, both operands' shapes, the options.
type Key = (
    Pass,
    Vec<usize>,
    Vec<usize>,
    [usize; 2],
    [usize; 2],
    [usize; 2],
    usize,
);

/// Shapes the implicit GEMM refused at set-up (they go straight to autotune afterwards,
/// so a refusal costs one attempt per process, not one per step), and the reasons already
/// said.
static REFUSED: Mutex<Option<(HashSet<Key>, HashSet<String>)>> = Mutex::new(None);

fn key(pass: Pass, x: &Shape, w: &Shape, o: &ConvOptions<2>) -> Key {
    (
        pass,
        x.as_slice().to_vec(),
        w.as_slice().to_vec(),
        o.stride,
        o.padding,
        o.dilation,
        o.groups,
    )
}

fn refused(k: &Key) -> bool {
    REFUSED
        .lock()
        .map(|r| r.as_ref().is_some_and(|(shapes, _)| shapes.contains(k)))
        .unwrap_or(false)
}

/// Records a refusal; the first shape refused for a reason is said on stderr, with the
/// reason (a GPU without tensor cores would otherwise print a line per layer). The run goes
/// on, on Burn's autotune.
fn refuse(k: Key, why: &dyn std::fmt::Debug) {
    let Ok(mut r) = REFUSED.lock() else { return };
    let (shapes, reasons) = r.get_or_insert_with(Default::default);
    let reason = format!("{why:?}");
    let say = reasons.insert(reason.clone());
    if shapes.insert(k.clone()) && say {
        eprintln!(
            "runner: backend.conv = \"implicit_gemm\" cannot take the {} of a convolution of {:?} by {:?} (stride {:?}, padding {:?}): {}; autotune takes it, and any other shape refused for this reason",
            k.0.name(),
            k.1,
            k.2,
            k.3,
            k.4,
            reason.trim()
        );
    }
}

/// `implicit_gemm`'s kernel for `pass`, or `None` where it is off or refuses the shape.
/// The operands are cheap handles, cloned so a refusal leaves them for the fallback.
fn try_gemm(
    pass: Pass,
    x: &FloatTensor<Cube>,
    weight: &FloatTensor<Cube>,
    output_grad: Option<&FloatTensor<Cube>>,
    options: &ConvOptions<2>,
) -> Option<FloatTensor<Cube>> {
    if !implicit_gemm() {
        return None;
    }
    let k = key(pass, &x.shape(), &weight.shape(), options);
    if refused(&k) {
        return None;
    }
    let (o, s) = (options.clone(), ConvStrategy::ImplicitGemm);
    let out = match (pass, output_grad) {
        (Pass::Forward, _) => conv_forward::<_, 2>(x.clone(), weight.clone(), None, o, s),
        (Pass::InputGrad, Some(dy)) => {
            conv_data_backward::<_, 2>(dy.clone(), weight.clone(), x.shape(), o, s)
        }
        (Pass::WeightGrad, Some(dy)) => {
            conv_weight_backward::<_, 2>(x.clone(), dy.clone(), weight.shape(), o, s)
        }
        _ => return None,
    };
    out.map_err(|e| refuse(k, &e)).ok()
}

impl ConvBackend for Cube {
    fn conv2d_nobias(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        try_gemm(Pass::Forward, &x, &weight, None, &options)
            .unwrap_or_else(|| Self::conv2d(x, weight, None, options))
    }

    fn conv2d_nobias_x_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        try_gemm(Pass::InputGrad, &x, &weight, Some(&output_grad), &options)
            .unwrap_or_else(|| Self::conv2d_x_backward(x, weight, output_grad, options))
    }

    fn conv2d_nobias_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        try_gemm(Pass::WeightGrad, &x, &weight, Some(&output_grad), &options)
            .unwrap_or_else(|| Self::conv2d_weight_backward(x, weight, output_grad, options))
    }
}

/// One convolution pass queued on the fused backend: when fusion executes it, the inner
/// backend's [`ConvBackend`] runs it (so `backend.conv` applies there too). Inputs are
/// `[x, weight]` for the forward pass, `[x, weight, output_grad]` for the gradients.
#[derive(Debug)]
struct FusedConv<B> {
    desc: CustomOpIr,
    pass: Pass,
    options: ConvOptions<2>,
    _b: PhantomData<B>,
}

impl<B: FusionBackend + ConvBackend> Operation<B::FusionRuntime> for FusedConv<B> {
    fn execute(
        &self,
        handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>,
    ) {
        let tensor =
            |h: &mut HandleContainer<_>, i: usize| h.get_float_tensor::<B>(&self.desc.inputs[i]);
        let (x, weight) = (tensor(handles, 0), tensor(handles, 1));
        let o = self.options.clone();
        let out = match self.pass {
            Pass::Forward => B::conv2d_nobias(x, weight, o),
            Pass::InputGrad => B::conv2d_nobias_x_backward(x, weight, tensor(handles, 2), o),
            Pass::WeightGrad => B::conv2d_nobias_weight_backward(x, weight, tensor(handles, 2), o),
        };
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, out);
    }
}

/// Queues `pass` on the fused backend with the output shape Burn's own op would have.
fn fused(
    pass: Pass,
    x: FloatTensor<Fusion<Cube>>,
    weight: FloatTensor<Fusion<Cube>>,
    output_grad: Option<FloatTensor<Fusion<Cube>>>,
    options: ConvOptions<2>,
) -> FloatTensor<Fusion<Cube>> {
    let client = x.client.clone();
    let dtype = x.dtype;
    let shape = match pass {
        Pass::Forward => {
            let (xs, ws) = (x.shape.as_slice(), weight.shape.as_slice());
            let size = |i: usize| {
                calculate_conv_output_size(
                    ws[2 + i],
                    options.stride[i],
                    options.padding[i],
                    options.dilation[i],
                    xs[2 + i],
                )
            };
            Shape::new([xs[0], ws[0], size(0), size(1)])
        }
        Pass::InputGrad => x.shape.clone(),
        Pass::WeightGrad => weight.shape.clone(),
    };
    let mut streams = OperationStreams::with_inputs([&x, &weight]);
    if let Some(dy) = &output_grad {
        streams.tensor(dy);
    }
    let mut inputs = vec![x.into_ir(), weight.into_ir()];
    inputs.extend(output_grad.map(|dy| dy.into_ir()));
    let out = TensorIr::uninit(client.create_empty_handle(), shape, dtype);
    // The options are part of the id, so fusion's cached plans tell convolutions of equal
    // shapes and different strides apart.
    let desc = CustomOpIr {
        id: format!("runner_conv2d_{pass:?}_{options:?}"),
        inputs,
        outputs: vec![out],
    };
    client
        .register(
            streams,
            OperationIr::Custom(desc.clone()),
            FusedConv::<Cube> {
                desc,
                pass,
                options,
                _b: PhantomData,
            },
        )
        .output()
}

impl ConvBackend for Fusion<Cube> {
    fn conv2d_nobias(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        if !implicit_gemm() {
            return Self::conv2d(x, weight, None, options);
        }
        fused(Pass::Forward, x, weight, None, options)
    }

    fn conv2d_nobias_x_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        if !implicit_gemm() {
            return Self::conv2d_x_backward(x, weight, output_grad, options);
        }
        fused(Pass::InputGrad, x, weight, Some(output_grad), options)
    }

    fn conv2d_nobias_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        if !implicit_gemm() {
            return Self::conv2d_weight_backward(x, weight, output_grad, options);
        }
        fused(Pass::WeightGrad, x, weight, Some(output_grad), options)
    }
}
