//! `backend.conv` on CubeCL's backends (CUDA; WebGPU in the tests): the models'
//! convolution through Burn's autotuned kernels (the default), or through one implicit-GEMM
//! kernel per pass with nothing tuned (`implicit_gemm`; a strided convolution's input
//! gradient, which Burn's implicit GEMM does not take, goes through its transposed
//! convolution, tuned between two kernels). Owns the process-wide choice and the record of
//! shapes the implicit GEMM refused; it does not configure CubeCL (`kernels` does).
//!
//! Why: burn-cubecl's `conv2d` always takes `ConvStrategy::default()`, which with the
//! `autotune` feature compiles and times every candidate kernel of each new convolution
//! shape before the step goes on: up to 477 kernels for ResNet-50's first step at batch
//! 64 (BENCHMARKS.md, "Start-up"). Burn exposes the strategy only on its kernel functions,
//! so the runner calls them itself: on the plain CubeCL backend directly, and through a
//! custom fusion operation on the fused one (Burn's own `conv2d` there would call the
//! inner backend's default again).
//!
//! `backend.conv_kernel`/`conv_tile` name another of CubeCL's implicit-GEMM kernels than
//! the one Burn's `ImplicitGemm` calls (`simple_sync_cyclic` on `cmma`); Burn 0.21 keeps
//! the others private, so the runner launches them through `cubek` as Burn's own launch
//! functions do (`launch_named`). A pass one refuses takes Burn's, then autotune.

use std::collections::HashSet;
use std::sync::Mutex;

use burn::tensor::ops::conv::calculate_conv_output_size;
use burn::tensor::ops::conv::calculate_padding_out;
use burn::tensor::ops::ConvTransposeOptions;
use burn::tensor::ops::{ConvOptions, FloatTensor, ModuleOps};
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::kernel::conv::{
    conv_data_backward, conv_forward, conv_transpose2d, conv_weight_backward, ConvStrategy,
    ConvTranspose2dStrategy,
};
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::ops::{permute_nchw_to_nhwc, permute_nchw_to_nhwc_shape, permute_nhwc_to_nchw};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime};
use burn_fusion::Fusion;
use burn_ir::OperationOutput;

use cubek::convolution::{
    AcceleratedTileKind, ConvAlgorithm, ConvolutionArgs, ConvolutionInputs, Strategy,
};
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::std::InputBinding;

use super::matmul_cube::matmul;
use super::queued::queue;
use super::ConvBackend;
use crate::plan::KernelPlan;
use crate::recipe::{ConvAlgo, ConvKernel, ConvSplit, ConvTile};

/// The float32 backends the runner builds on a CubeCL runtime.
type Cube<R, BT> = CubeBackend<R, f32, i32, BT>;

/// `backend.conv`, `conv_kernel`, `conv_tile` and `conv_split` of the run that queues
/// convolutions now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Choice {
    algo: ConvAlgo,
    kernel: ConvKernel,
    tile: ConvTile,
    split: ConvSplit,
}

impl Choice {
    /// Burn's own implicit GEMM (`ConvStrategy::ImplicitGemm`).
    const BURNS: (ConvKernel, ConvTile) = (ConvKernel::SimpleSyncCyclic, ConvTile::Cmma);

    /// The kernel to launch by name, where it is not Burn's own.
    fn named(self) -> Option<(ConvKernel, ConvTile)> {
        (self.algo == ConvAlgo::ImplicitGemm && (self.kernel, self.tile) != Self::BURNS)
            .then_some((self.kernel, self.tile))
    }
}

static CHOICE: Mutex<Choice> = Mutex::new(Choice {
    algo: ConvAlgo::Autotune,
    kernel: ConvKernel::SimpleSyncCyclic,
    tile: ConvTile::Cmma,
    split: ConvSplit::Auto,
});

/// Sets `backend.conv` (and its kernel) for the convolutions queued from now on (each run
/// sets its own).
pub fn set(kernels: &KernelPlan) {
    set_choice(Choice {
        algo: kernels.conv,
        kernel: kernels.conv_kernel,
        tile: kernels.conv_tile,
        split: kernels.conv_split,
    });
}

fn set_choice(c: Choice) {
    *CHOICE.lock().unwrap_or_else(|e| e.into_inner()) = c;
}

fn current() -> Choice {
    *CHOICE.lock().unwrap_or_else(|e| e.into_inner())
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

/// A convolution as an implicit GEMM sees it: the pass, the kernel, both operands' shapes,
/// the options. Plain arrays: it is built for every convolution of every step under
/// `implicit_gemm`.
type Key = (
    Pass,
    (ConvKernel, ConvTile),
    [usize; 4],
    [usize; 4],
    [usize; 2],
    [usize; 2],
    [usize; 2],
    usize,
);

fn key(
    pass: Pass,
    kernel: (ConvKernel, ConvTile),
    x: &Shape,
    w: &Shape,
    o: &ConvOptions<2>,
) -> Key {
    (
        pass,
        kernel,
        x.dims(),
        w.dims(),
        o.stride,
        o.padding,
        o.dilation,
        o.groups,
    )
}

/// What the implicit GEMM did with each shape so far in this process.
#[derive(Default)]
struct Seen {
    /// Refused at set-up or failed at its first launch: autotune takes these from then on,
    /// so a refusal costs one attempt per process, not one per step.
    refused: HashSet<Key>,
    /// Ran once without an error reported.
    ran: HashSet<Key>,
    /// Reasons already said on stderr.
    reasons: HashSet<String>,
    /// Shapes the runner's own routes ([`Route`]) failed at set-up or at their first
    /// launch (Burn's kernels take these), and those that ran.
    route_refused: HashSet<(Route, Key)>,
    route_ran: HashSet<(Route, Key)>,
}

static SEEN: Mutex<Option<Seen>> = Mutex::new(None);

fn seen<T>(f: impl FnOnce(&mut Seen) -> T) -> Option<T> {
    let mut guard = SEEN.lock().ok()?;
    Some(f(guard.get_or_insert_with(Seen::default)))
}

/// Records a refusal; the first shape refused for a reason is said on stderr, with the
/// reason (a GPU without tensor cores would otherwise print a line per layer). The run goes
/// on, on Burn's implicit GEMM after a named kernel, else on Burn's autotune.
fn refuse(k: Key, why: &dyn std::fmt::Debug) {
    let (kernel, tile) = k.1;
    let (what, next) = if k.1 == Choice::BURNS {
        ("backend.conv = \"implicit_gemm\"".to_string(), "autotune")
    } else {
        (
            format!(
                "backend.conv_kernel = \"{}\" (conv_tile \"{}\")",
                kernel.name(),
                tile.name()
            ),
            "simple_sync_cyclic (then autotune)",
        )
    };
    let reason = format!("{why:?}");
    let said = format!("{what}: {reason}");
    let say = seen(|s| s.refused.insert(k) && s.reasons.insert(said));
    if say == Some(true) {
        crate::errln!(
            "runner: {what} cannot take the {} of a convolution of {:?} by {:?} (stride {:?}, padding {:?}): {}; {next} takes it, and any other shape refused for this reason",
            k.0.name(),
            k.2,
            k.3,
            k.4,
            k.5,
            reason.trim()
        );
    }
}

/// CubeCL's strategy for a named kernel.
fn strategy(kernel: ConvKernel, tile: ConvTile) -> Strategy {
    let algorithm = match kernel {
        ConvKernel::SimpleSyncCyclic => ConvAlgorithm::SimpleSyncCyclic,
        ConvKernel::SimpleSyncStrided => ConvAlgorithm::SimpleSyncStrided,
        ConvKernel::SimpleSyncTilewise => ConvAlgorithm::SimpleSyncTilewise,
        ConvKernel::SimpleAsyncCyclic => ConvAlgorithm::SimpleAsyncCyclic,
        ConvKernel::SimpleAsyncStrided => ConvAlgorithm::SimpleAsyncStrided,
        ConvKernel::SimpleAsyncTma => ConvAlgorithm::SimpleAsyncTma,
        ConvKernel::SpecializedAsyncCyclic => ConvAlgorithm::SpecializedAsyncCyclic,
        ConvKernel::SpecializedAsyncStrided => ConvAlgorithm::SpecializedAsyncStrided,
        ConvKernel::SpecializedTma => ConvAlgorithm::SpecializedTma,
    };
    let tile_kind = match tile {
        ConvTile::Cmma => AcceleratedTileKind::Cmma,
        ConvTile::Mma => AcceleratedTileKind::Mma,
    };
    Strategy::Inferred {
        algorithm,
        tile_kind,
    }
}

/// `pass` through the named kernel, as Burn's `conv_forward`, `conv_data_backward` and
/// `conv_weight_backward` launch theirs: the operands as channels-last views, the result
/// allocated channels-last and returned as an NCHW view of it. `x` gives the input's shape
/// to the input gradient. Errors are the refusals (set-up checks; a launch failure comes at
/// the next flush, as for Burn's).
fn launch_named<R: CubeRuntime>(
    pass: Pass,
    strategy: &Strategy,
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    output_grad: Option<CubeTensor<R>>,
    options: &ConvOptions<2>,
) -> Result<CubeTensor<R>, String> {
    if options.groups != 1 {
        return Err(format!("groups = {}", options.groups));
    }
    let args = ConvolutionArgs {
        stride: options.stride,
        padding: options.padding,
        dilation: options.dilation,
    };
    let client = x.client.clone();
    let device = x.device.clone();
    let dtype = x.dtype;
    let dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: dtype.into(),
        rhs: dtype.into(),
        out: dtype.into(),
    });
    let bind = |t: CubeTensor<R>| {
        let d = t.dtype;
        InputBinding::new(t.binding(), d.into())
    };
    let launch = |inputs| {
        cubek::convolution::launch_ref::<R, 2>(strategy, &client, inputs, args, dtypes)
            .map_err(|e| format!("{e:?}"))
    };
    let out = match (pass, output_grad) {
        (Pass::Forward, _) => {
            let size = |i: usize| {
                calculate_conv_output_size(
                    weight.shape()[2 + i],
                    options.stride[i],
                    options.padding[i],
                    options.dilation[i],
                    x.shape()[2 + i],
                )
            };
            let shape = Shape::new([x.shape()[0], size(0), size(1), weight.shape()[0]]);
            let out = empty_device_dtype(client.clone(), device, shape, dtype);
            launch(ConvolutionInputs::Forward {
                input: bind(permute_nchw_to_nhwc(x)),
                weight: bind(permute_nchw_to_nhwc(weight)),
                bias: None,
                out: out.clone().binding(),
            })?;
            out
        }
        (Pass::InputGrad, Some(dy)) => {
            if options.stride.iter().any(|&s| s != 1) {
                // As Burn's launch refuses it (the kernel assumes stride 1).
                return Err(format!(
                    "stride {:?} (its input gradient takes stride 1)",
                    options.stride
                ));
            }
            let shape = permute_nchw_to_nhwc_shape(x.shape());
            let dx = empty_device_dtype(client.clone(), device, shape, dtype);
            launch(ConvolutionInputs::BackwardData {
                out_grad: bind(permute_nchw_to_nhwc(dy)),
                weights: bind(permute_nchw_to_nhwc(weight)),
                in_grad: dx.clone().binding(),
            })?;
            dx
        }
        (Pass::WeightGrad, Some(dy)) => {
            let shape = permute_nchw_to_nhwc_shape(weight.shape());
            let dw = empty_device_dtype(client.clone(), device, shape, dtype);
            launch(ConvolutionInputs::BackwardWeight {
                input: bind(permute_nchw_to_nhwc(x)),
                out_grad: bind(permute_nchw_to_nhwc(dy)),
                weight_grad: dw.clone().binding(),
            })?;
            dw
        }
        (_, None) => return Err("a gradient pass without its output gradient".into()),
    };
    Ok(permute_nhwc_to_nchw(out))
}

/// An implicit GEMM's kernel for `pass`: the named one, else (`None`) Burn's own; `None`
/// back where it refuses the shape. The operands are cheap handles, cloned so a refusal
/// leaves them for the fallback.
fn try_gemm<R: CubeRuntime, BT: BoolElement>(
    pass: Pass,
    named: Option<(ConvKernel, ConvTile)>,
    x: &FloatTensor<Cube<R, BT>>,
    weight: &FloatTensor<Cube<R, BT>>,
    output_grad: Option<&FloatTensor<Cube<R, BT>>>,
    options: &ConvOptions<2>,
) -> Option<FloatTensor<Cube<R, BT>>> {
    let kernel = named.unwrap_or(Choice::BURNS);
    let k = key(pass, kernel, &x.shape(), &weight.shape(), options);
    if seen(|s| s.refused.contains(&k)).unwrap_or(true) {
        return None;
    }
    let (o, s) = (options.clone(), ConvStrategy::ImplicitGemm);
    let out = match (named, pass, output_grad) {
        (Some((kernel, tile)), _, dy) => launch_named::<R>(
            pass,
            &strategy(kernel, tile),
            x.clone(),
            weight.clone(),
            dy.cloned(),
            options,
        ),
        (None, Pass::Forward, _) => conv_forward::<R, 2>(x.clone(), weight.clone(), None, o, s)
            .map_err(|e| format!("{e:?}")),
        (None, Pass::InputGrad, Some(dy)) => {
            conv_data_backward::<R, 2>(dy.clone(), weight.clone(), x.shape(), o, s)
                .map_err(|e| format!("{e:?}"))
        }
        (None, Pass::WeightGrad, Some(dy)) => {
            conv_weight_backward::<R, 2>(x.clone(), dy.clone(), weight.shape(), o, s)
                .map_err(|e| format!("{e:?}"))
        }
        _ => return None,
    };
    let out = match out {
        Ok(out) => out,
        Err(e) => {
            refuse(k, &format_args!("{e}"));
            return None;
        }
    };
    // Set-up checks are all an `Err` covers: a kernel that fails to compile or to launch
    // is reported by the device at its next flush. So a shape's first run is flushed, and
    // an error there sends the shape to autotune too (its output is dropped).
    if seen(|s| s.ran.insert(k)).unwrap_or(false) {
        if let Err(e) = out.client.flush() {
            refuse(k, &e);
            return None;
        }
    }
    Some(out)
}

/// The fewest pixels of the batch a slice of a split weight gradient sums over (the depth
/// of each of the batched matmul's products). Small in the tests, so their small shapes
/// split too.
const SPLIT_MIN_ROWS: usize = if cfg!(test) { 4 } else { 256 };

/// The most memory a split weight gradient's patch matrix may take (a 3×3 convolution's
/// is the input nine times over; a 1×1 stride-1 one's is the input itself, no copy).
const SPLIT_MAX_PATCH_BYTES: usize = 1 << 30;

/// Into how many slices of the batch's pixels to split the weight gradient of a
/// convolution with `rows` output pixels (batch × height × width) and a weight of
/// `out_channels` × `patch` (in channels × kernel area), on a device of `sms`
/// multiprocessors: 1 where the implicit GEMM's own 64×64 output blocks are enough to
/// keep about two cubes per multiprocessor busy, else the power of two that brings the
/// slices' blocks there, each slice at least `min_rows` pixels and all of them equal.
fn split_count(
    rows: usize,
    out_channels: usize,
    patch: usize,
    sms: Option<u32>,
    min_rows: usize,
) -> usize {
    let blocks = out_channels.div_ceil(64) * patch.div_ceil(64);
    let target = sms.map_or(64, |m| 2 * m as usize);
    let mut split = 1;
    while blocks * split < target
        && rows.is_multiple_of(2 * split)
        && rows / (2 * split) >= min_rows
    {
        split *= 2;
    }
    split
}

/// The weight gradient of a convolution whose weight is too small for the implicit GEMM
/// to keep the GPU busy (`backend.conv_split = "auto"`). The implicit GEMM's output is the
/// weight (`out_channels × in_channels·kh·kw`) and its depth the batch's pixels: one
/// cube per 64×64 block of the weight then loops over every pixel (ResNet-50's first
/// 3×3 at batch 64: 9 cubes, 65,536 pixels each; 4-5 ms a launch on an H200 where a
/// forward pass with the same arithmetic took 0.1-0.3 ms). Here the pixels are cut into
/// `S` equal slices ([`split_count`]) and the gradient is a batched matmul, `S`
/// products `dyᵀ[o, slice] · patches[slice, (kh, kw, c)]`, summed over the slices.
/// `patches` is the input itself for a 1×1 stride-1 convolution without padding,
/// channels-last as the batch norm leaves it, else the input's patches gathered once
/// (kernel area × input size; not split above `SPLIT_MAX_PATCH_BYTES`, nor with groups
/// or dilation, which ResNets do not have). The result is
/// channels-last, as the implicit GEMM's. `Ok(None)`: no split is needed; `Err`: the
/// matmul refused (the implicit GEMM takes it).
fn weight_grad_split<R: CubeRuntime, BT: BoolElement>(
    x: &FloatTensor<Cube<R, BT>>,
    weight: &Shape,
    dy: &FloatTensor<Cube<R, BT>>,
    options: &ConvOptions<2>,
) -> Result<Option<FloatTensor<Cube<R, BT>>>, String> {
    use burn::tensor::ops::FloatTensorOps;
    use burn_cubecl::kernel::reduce::{reduce_dim, KernelReduceStrategy};
    use cubek::reduce::components::instructions::ReduceOperationConfig;
    type C<R, BT> = Cube<R, BT>;

    if options.groups != 1 || options.dilation != [1, 1] {
        return Ok(None);
    }
    let [n, c, _, _] = x.shape().dims();
    let [o, _, kh, kw] = weight.dims();
    let [_, _, oh, ow] = dy.shape().dims();
    let (rows, patch) = (n * oh * ow, kh * kw * c);
    let sms = x.client.properties().hardware.num_streaming_multiprocessors;
    let split = split_count(rows, o, patch, sms, SPLIT_MIN_ROWS);
    if split == 1 {
        return Ok(None);
    }
    let plain = kh * kw == 1 && options.stride == [1, 1] && options.padding == [0, 0];
    // (The patches' kernel is float32's, as the runner's models are.)
    if !plain && (rows * patch * x.dtype.size() > SPLIT_MAX_PATCH_BYTES || x.dtype != DType::F32) {
        return Ok(None);
    }

    // The input's patches, [n·oh·ow, (kh, kw, c)]: the input itself, channels-last, for a
    // 1×1 stride-1 convolution without padding (no launch), else gathered by one kernel
    // (`patches_cube`; three launches of Burn's ops before: zeros, the padded input, the
    // copy of its unfolded view).
    let patches = if plain {
        C::<R, BT>::float_permute(x.clone(), &[0, 2, 3, 1])
    } else {
        super::patches_cube::patches(x, [kh, kw], options.stride, options.padding, [oh, ow])
    };
    let per = rows / split;
    let patches = C::<R, BT>::float_reshape(patches, Shape::new([split, per, patch]));
    let dyl = C::<R, BT>::float_permute(dy.clone(), &[0, 2, 3, 1]);
    let dyl = C::<R, BT>::float_reshape(dyl, Shape::new([split, per, o]));
    let lhs = C::<R, BT>::float_swap_dims(dyl, 1, 2);

    let partial = matmul(&lhs, &patches, Shape::new([split, o, patch]))?;
    let sum = reduce_dim(
        partial,
        None,
        0,
        KernelReduceStrategy::Unspecified,
        ReduceOperationConfig::Sum,
    )
    .map_err(|e| format!("{e:?}"))?;
    let dw = C::<R, BT>::float_reshape(sum, Shape::new([o, kh, kw, c]));
    Ok(Some(C::<R, BT>::float_permute(dw, &[0, 3, 1, 2])))
}

/// The input gradient of a strided convolution, which Burn's implicit GEMM does not take
/// (stride 1 only) and hands to its transposed convolution: autotuned between a direct
/// kernel (wrong where the kernel is shorter than the stride, see
/// [`direct_transpose_is_wrong`]) and col2im, which copies its operands into its own
/// layouts (13 copy launches a step for ResNet-50's 1×1 shortcuts on the stand-in driver)
/// and loops over runs of the batch. Here it is one matmul and one gather, channels-last:
/// `cols = dy_rows · W` (`[n·oh·ow, o]` by the weight as `[o, (kh, kw, c)]`: each output
/// position's contribution to each of its taps), then each input pixel sums the taps that
/// read it ([`super::patches_cube::gather_taps`]). The output gradient is read
/// channels-last as the batch norm leaves it (no copy); the weight, a small tensor, is
/// copied into `[o, kh, kw, c]` where the kernel is larger than 1×1. `Ok(None)`: not a
/// strided convolution this takes (groups, dilation, not `f32`, `cols` over
/// `SPLIT_MAX_PATCH_BYTES`); `Err`: the matmul refused.
fn input_grad_gather<R: CubeRuntime, BT: BoolElement>(
    x: &Shape,
    weight: &FloatTensor<Cube<R, BT>>,
    dy: &FloatTensor<Cube<R, BT>>,
    options: &ConvOptions<2>,
) -> Result<Option<FloatTensor<Cube<R, BT>>>, String> {
    use burn::tensor::ops::FloatTensorOps;
    type C<R, BT> = Cube<R, BT>;

    if options.stride == [1, 1]
        || options.groups != 1
        || options.dilation != [1, 1]
        || dy.dtype != DType::F32
        || weight.dtype != DType::F32
    {
        return Ok(None);
    }
    let [n, c, h, w] = x.dims();
    let [o, _, kh, kw] = weight.shape().dims();
    let [_, _, oh, ow] = dy.shape().dims();
    let (rows, patch) = (n * oh * ow, kh * kw * c);
    if rows * patch * DType::F32.size() > SPLIT_MAX_PATCH_BYTES {
        return Ok(None);
    }
    let dyl = C::<R, BT>::float_permute(dy.clone(), &[0, 2, 3, 1]);
    let dyl = C::<R, BT>::float_reshape(dyl, Shape::new([rows, o]));
    let wl = C::<R, BT>::float_permute(weight.clone(), &[0, 2, 3, 1]);
    let wl = C::<R, BT>::float_reshape(wl, Shape::new([o, patch]));
    let cols = matmul(&dyl, &wl, Shape::new([rows, patch]))?;
    let dx = super::patches_cube::gather_taps(
        &cols,
        [n, c, h, w],
        [kh, kw],
        options.stride,
        options.padding,
        [oh, ow],
    );
    Ok(Some(C::<R, BT>::float_permute(dx, &[0, 3, 1, 2])))
}

/// The runner's own routes for the gradients that CubeCL's kernels take poorly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Route {
    /// [`weight_grad_split`] (`backend.conv_split = "auto"`).
    Split,
    /// [`input_grad_gather`].
    Gather,
}

/// `route` where it applies and has not failed for this shape before; a failure (said
/// once per reason) sends the shape to Burn's kernels from then on.
fn try_route<R: CubeRuntime, BT: BoolElement>(
    route: Route,
    x: &FloatTensor<Cube<R, BT>>,
    weight: &FloatTensor<Cube<R, BT>>,
    dy: &FloatTensor<Cube<R, BT>>,
    options: &ConvOptions<2>,
) -> Option<FloatTensor<Cube<R, BT>>> {
    let pass = match route {
        Route::Split => Pass::WeightGrad,
        Route::Gather => Pass::InputGrad,
    };
    let k = key(pass, Choice::BURNS, &x.shape(), &weight.shape(), options);
    if seen(|s| s.route_refused.contains(&(route, k))).unwrap_or(true) {
        return None;
    }
    let fail = |why: String| {
        let said = format!("{route:?}: {why}");
        if seen(|s| s.route_refused.insert((route, k)) && s.reasons.insert(said)) == Some(true) {
            let (what, instead) = match route {
                Route::Split => (
                    "backend.conv_split = \"auto\" cannot take",
                    "CubeCL's implicit GEMM",
                ),
                Route::Gather => (
                    "the runner's matmul and gather cannot take",
                    "Burn's transposed convolution",
                ),
            };
            crate::errln!(
                "runner: {what} the {} of a convolution of {:?} by {:?}: {}; {instead} takes it, and any other shape refused for this reason",
                pass.name(),
                k.2,
                k.3,
                why.trim()
            );
        }
    };
    let got = match route {
        Route::Split => weight_grad_split::<R, BT>(x, &weight.shape(), dy, options),
        Route::Gather => input_grad_gather::<R, BT>(&x.shape(), weight, dy, options),
    };
    match got {
        Ok(Some(out)) => {
            if seen(|s| s.route_ran.insert((route, k))).unwrap_or(false) {
                if let Err(e) = out.client.flush() {
                    fail(format!("{e:?}"));
                    return None;
                }
            }
            Some(out)
        }
        Ok(None) => None,
        Err(e) => {
            fail(e);
            None
        }
    }
}

/// Whether Burn's own input gradient can come back wrong: when the kernel's extent is
/// shorter than the stride (`kernel · dilation < stride` along a side, as in ResNet's 1×1
/// stride-2 shortcut), burn-cubecl 0.21's direct transposed-convolution kernel, one of the
/// two its input gradient is tuned between (Burn's implicit GEMM takes stride 1 only),
/// sums over an empty range and returns zeros: its rows run from `y_start` to
/// `y_start + kernel · dilation − stride + 1`. Autotune keeps it wherever it is the faster
/// one, which on lavapipe it is (and the test in this file caught it).
fn direct_transpose_is_wrong(weight: &Shape, options: &ConvOptions<2>) -> bool {
    (0..2).any(|i| weight.as_slice()[2 + i] * options.dilation[i] < options.stride[i])
}

/// The input gradient through Burn's other transposed convolution (a matmul, then col2im,
/// which gathers every output position's taps and so is right for any stride).
fn input_grad_col2im<R: CubeRuntime, BT: BoolElement>(
    x: &FloatTensor<Cube<R, BT>>,
    weight: FloatTensor<Cube<R, BT>>,
    output_grad: FloatTensor<Cube<R, BT>>,
    options: &ConvOptions<2>,
) -> Option<FloatTensor<Cube<R, BT>>> {
    let (xs, ws, ys) = (x.shape(), weight.shape(), output_grad.shape());
    let padding_out = [0, 1].map(|i| {
        calculate_padding_out(
            ws[2 + i],
            options.stride[i],
            options.padding[i],
            options.dilation[i],
            xs[2 + i],
            ys[2 + i],
        )
    });
    let o = ConvTransposeOptions::new(
        options.stride,
        options.padding,
        padding_out,
        options.dilation,
        options.groups,
    );
    match conv_transpose2d(output_grad, weight, None, o, ConvTranspose2dStrategy::Gemm) {
        Ok(dx) => Some(dx),
        Err(e) => {
            let reason = format!("col2im: {e:?}");
            if seen(|s| s.reasons.insert(reason.clone())) == Some(true) {
                crate::errln!(
                    "runner: the input gradient of a convolution of {xs:?} by {ws:?} (stride {:?}) cannot go through Burn's col2im ({}); Burn's default takes it, whose direct kernel may return zeros for this shape",
                    options.stride,
                    reason.trim()
                );
            }
            None
        }
    }
}

/// `pass` on the plain CubeCL backend with the strategy `algo`. `output_grad` is there for
/// the two gradients.
fn run_pass<R: CubeRuntime, BT: BoolElement>(
    pass: Pass,
    choice: Choice,
    x: FloatTensor<Cube<R, BT>>,
    weight: FloatTensor<Cube<R, BT>>,
    output_grad: Option<FloatTensor<Cube<R, BT>>>,
    options: ConvOptions<2>,
) -> FloatTensor<Cube<R, BT>> {
    #[cfg(test)]
    tests::note_layouts::<R>(pass, &x, &weight, output_grad.as_ref());
    // First, whatever `algo` says: the implicit GEMM hands a strided input gradient to the
    // same transposed convolution. The runner's matmul and gather take it; where they
    // refuse, col2im where the direct kernel would be wrong.
    if let (Pass::InputGrad, Some(dy)) = (pass, &output_grad) {
        if let Some(dx) = try_route::<R, BT>(Route::Gather, &x, &weight, dy, &options) {
            return dx;
        }
        if direct_transpose_is_wrong(&weight.shape(), &options) {
            let fixed = input_grad_col2im::<R, BT>(&x, weight.clone(), dy.clone(), &options);
            if let Some(dx) = fixed {
                return dx;
            }
        }
    }
    if choice.algo == ConvAlgo::ImplicitGemm {
        let dy = output_grad.as_ref();
        if let (Pass::WeightGrad, Some(dy), ConvSplit::Auto) = (pass, dy, choice.split) {
            if let Some(dw) = try_route::<R, BT>(Route::Split, &x, &weight, dy, &options) {
                return dw;
            }
        }
        if let Some(named) = choice.named() {
            if let Some(out) = try_gemm::<R, BT>(pass, Some(named), &x, &weight, dy, &options) {
                return out;
            }
        }
        if let Some(out) = try_gemm::<R, BT>(pass, None, &x, &weight, dy, &options) {
            return out;
        }
    }
    type C<R, BT> = Cube<R, BT>;
    match (pass, output_grad) {
        (Pass::InputGrad, Some(dy)) => C::<R, BT>::conv2d_x_backward(x, weight, dy, options),
        (Pass::WeightGrad, Some(dy)) => C::<R, BT>::conv2d_weight_backward(x, weight, dy, options),
        _ => C::<R, BT>::conv2d(x, weight, None, options),
    }
}

/// Whether `t` (`[o, c, kh, kw]`) is held channels-last: `[o, kh, kw, c]` in memory, the
/// channels its contiguous axis.
fn channels_last<R: CubeRuntime>(t: &CubeTensor<R>) -> bool {
    let strides = t.meta.strides();
    let shape = t.shape();
    shape.num_dims() == 4
        && strides[1] == 1
        && strides[3] == shape[1]
        && strides[2] == shape[1] * shape[3]
        && strides[0] == shape[1] * shape[3] * shape[2]
}

/// A convolution weight `[o, c, kh, kw]` held channels-last: `[o, kh, kw, c]` contiguous,
/// seen through a permutation. CubeCL's implicit GEMM reads the weight with its channels
/// as the contiguous axis and copies any other (`contiguous_pitched_layout` in
/// cubek-convolution): ResNet-50's 16 3×3 weights and the stem's, in the forward pass and
/// the input gradient, 31 copies a step on the stand-in driver. Its weight gradients are
/// channels-last already, and the optimizers write a parameter in its own layout, so a
/// weight made channels-last once, when the model is built or loaded, stays so. A 1×1
/// weight is channels-last as `[o, c, 1, 1]` and is kept; so is anything not 4-D `f32`.
fn weight_channels_last<R: CubeRuntime>(w: CubeTensor<R>) -> CubeTensor<R> {
    let shape = w.shape();
    if shape.num_dims() != 4 || shape[2] * shape[3] == 1 || w.dtype != DType::F32 {
        return w;
    }
    if channels_last(&w) {
        return w;
    }
    let nhwc = burn_cubecl::kernel::into_contiguous(permute_nchw_to_nhwc(w));
    permute_nhwc_to_nchw(nhwc)
}

impl<R: CubeRuntime, BT: BoolElement> ConvBackend for Cube<R, BT> {
    fn conv_weight_layout(weight: FloatTensor<Self>) -> FloatTensor<Self> {
        weight_channels_last(weight)
    }

    fn conv2d_nobias(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        run_pass::<R, BT>(Pass::Forward, current(), x, weight, None, options)
    }

    fn conv2d_nobias_x_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        run_pass::<R, BT>(
            Pass::InputGrad,
            current(),
            x,
            weight,
            Some(output_grad),
            options,
        )
    }

    fn conv2d_nobias_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        run_pass::<R, BT>(
            Pass::WeightGrad,
            current(),
            x,
            weight,
            Some(output_grad),
            options,
        )
    }
}

/// Queues `pass` on the fused backend, with the strategy of the run that queues it, its
/// output shaped and typed as Burn's own op's: when fusion executes it, the plain backend
/// runs it ([`run_pass`]). Inputs are `[x, weight]` for the forward pass, `[x, weight,
/// output_grad]` for the gradients.
fn fused<R: CubeRuntime, BT: BoolElement>(
    pass: Pass,
    x: FloatTensor<Fusion<Cube<R, BT>>>,
    weight: FloatTensor<Fusion<Cube<R, BT>>>,
    output_grad: Option<FloatTensor<Fusion<Cube<R, BT>>>>,
    options: ConvOptions<2>,
) -> FloatTensor<Fusion<Cube<R, BT>>> {
    let dtype = output_grad.as_ref().map_or(x.dtype, |dy| dy.dtype);
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
    let mut inputs = vec![x, weight];
    inputs.extend(output_grad);
    let choice = current();
    let id = match (pass, choice.algo) {
        (Pass::Forward, ConvAlgo::Autotune) => "runner_conv2d_forward_autotune",
        (Pass::Forward, ConvAlgo::ImplicitGemm) => "runner_conv2d_forward_implicit_gemm",
        (Pass::InputGrad, ConvAlgo::Autotune) => "runner_conv2d_input_grad_autotune",
        (Pass::InputGrad, ConvAlgo::ImplicitGemm) => "runner_conv2d_input_grad_implicit_gemm",
        (Pass::WeightGrad, ConvAlgo::Autotune) => "runner_conv2d_weight_grad_autotune",
        (Pass::WeightGrad, ConvAlgo::ImplicitGemm) => "runner_conv2d_weight_grad_implicit_gemm",
    };
    let run = move |t: Vec<CubeTensor<R>>| {
        let mut t = t.into_iter();
        let (Some(x), Some(weight)) = (t.next(), t.next()) else {
            return vec![];
        };
        let o = options.clone();
        vec![run_pass::<R, BT>(pass, choice, x, weight, t.next(), o)]
    };
    queue::<R, BT, _>(id, inputs, &[(shape, dtype)], run).output()
}

impl<R: CubeRuntime, BT: BoolElement> ConvBackend for Fusion<Cube<R, BT>> {
    /// [`weight_channels_last`] queued, a custom operation: fusion's own ops would write
    /// the permutation's result in their own layout.
    fn conv_weight_layout(weight: FloatTensor<Self>) -> FloatTensor<Self> {
        let out = (weight.shape.clone(), weight.dtype);
        let run = |t: Vec<CubeTensor<R>>| t.into_iter().map(weight_channels_last).collect();
        let name = "runner_conv_weight_channels_last";
        queue::<R, BT, _>(name, vec![weight], &[out], run).output()
    }

    fn conv2d_nobias(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        if current().algo == ConvAlgo::Autotune {
            return Self::conv2d(x, weight, None, options);
        }
        fused::<R, BT>(Pass::Forward, x, weight, None, options)
    }

    fn conv2d_nobias_x_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        // A strided input gradient is the runner's own (`run_pass`) whatever the strategy.
        if current().algo == ConvAlgo::Autotune && options.stride == [1, 1] {
            return Self::conv2d_x_backward(x, weight, output_grad, options);
        }
        fused::<R, BT>(Pass::InputGrad, x, weight, Some(output_grad), options)
    }

    fn conv2d_nobias_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        if current().algo == ConvAlgo::Autotune {
            return Self::conv2d_weight_backward(x, weight, output_grad, options);
        }
        fused::<R, BT>(Pass::WeightGrad, x, weight, Some(output_grad), options)
    }
}

/// The convolution on a real CubeCL runtime: WebGPU on Mesa's software Vulkan (lavapipe),
/// fused and not, with `backend.conv` at each value, against the CPU's. This runs the code
/// CUDA runs (the custom fusion op, Burn's kernel functions, the fallback of a refused
/// shape: lavapipe has no tensor cores, so the implicit GEMM refuses every shape) on a
/// machine without a GPU; `cargo test --release --features wgpu` (see `.ci/run`).
///
/// On CUDA (`cargo test --release --features cuda --lib -- cuda_`, on a machine with a
/// GPU; `scripts/gpu-check.sh` runs it when given the test binary): every named kernel
/// against the definition, which shows a kernel that computes wrong before its speed is
/// read.
#[cfg(all(test, any(feature = "wgpu", feature = "cuda")))]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Distribution, Tensor, TensorData};

    use super::*;
    use crate::ops::{conv2d, TrainBackend};

    /// The tests that set `backend.conv` take turns (the choice is process-wide).
    static SERIAL: Mutex<()> = Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Each pass `run_pass` got, by its weight's shape: whether the activations it reads
    /// (`x` forward and for the weight gradient, the output gradient for both gradients)
    /// were channels-last in memory, which CubeCL's implicit GEMM takes as they are (it
    /// copies any other layout first: `contiguous_pitched_layout`, cubek-convolution 0.2).
    static LAYOUTS: Mutex<Vec<(Pass, [usize; 4], Reads)>> = Mutex::new(Vec::new());

    /// Of each activation a pass read, whether it was channels-last.
    type Reads = Vec<bool>;

    /// The passes of one convolution, each with its [`Reads`].
    #[cfg(feature = "wgpu")]
    type Passes = Vec<(Pass, Reads)>;

    pub(super) fn note_layouts<R: CubeRuntime>(
        pass: Pass,
        x: &CubeTensor<R>,
        weight: &CubeTensor<R>,
        output_grad: Option<&CubeTensor<R>>,
    ) {
        let last = |t: &CubeTensor<R>| t.meta.strides()[1] == 1;
        let read = match (pass, output_grad) {
            (Pass::Forward, _) => vec![last(x)],
            (Pass::InputGrad, Some(dy)) => vec![last(dy)],
            (Pass::WeightGrad, Some(dy)) => vec![last(x), last(dy)],
            (_, None) => vec![],
        };
        let w = weight.shape().dims();
        LAYOUTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((pass, w, read));
    }

    /// What [`note_layouts`] saw of the passes of weights shaped `w`.
    #[cfg(feature = "wgpu")]
    fn layouts_of(w: [usize; 4]) -> Passes {
        let seen = LAYOUTS.lock().unwrap_or_else(|e| e.into_inner());
        seen.iter()
            .filter(|(_, ws, _)| *ws == w)
            .map(|(p, _, read)| (*p, read.clone()))
            .collect()
    }

    /// Conv, batch norm and ReLU, conv, batch norm (a ResNet's unit twice), trained one
    /// step on CubeCL with `implicit_gemm`: every activation the second convolution reads,
    /// forward and backward, and the output gradient of the first, arrive channels-last,
    /// so CubeCL's implicit GEMM copies none of them (before the batch norm worked
    /// channels-last, it copied all five). The first convolution's input, the image batch,
    /// is `[n, c, h, w]` in memory, so it is not. The weights' shapes are this test's own.
    #[cfg(feature = "wgpu")]
    fn unit_twice<B: TrainBackend>() -> (Passes, Passes) {
        let (w1s, w2s) = ([24, 3, 3, 3], [40, 24, 3, 3]);
        let device = Default::default();
        let x = Tensor::<B, 4>::from_data(random([2, 3, 8, 8]), &device);
        let w1 = Tensor::<B, 4>::from_data(random(w1s), &device).require_grad();
        let w2 = Tensor::<B, 4>::from_data(random(w2s), &device).require_grad();
        let ones = |c| Tensor::<B, 1>::ones([c], &device).require_grad();
        let zeros = |c| Tensor::<B, 1>::zeros([c], &device).require_grad();
        let options = ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
        let y = conv2d(x, w1.clone(), options.clone());
        let (y, _, _) = crate::ops::batch_norm_train_act(y, ones(24), zeros(24), 1e-5, None, true);
        let z = conv2d(y, w2.clone(), options);
        let (z, _, _) = crate::ops::batch_norm_train_act(z, ones(40), zeros(40), 1e-5, None, false);
        let dy = Tensor::<B, 4>::from_data(random([2, 40, 8, 8]), &device);
        let grads = (z * dy).sum().backward();
        // Read, so that fusion runs every pass (their values: the other tests).
        for w in [&w1, &w2] {
            let dw = w.grad(&grads).expect("a weight gradient").into_data();
            assert!(dw.to_vec::<f32>().unwrap().iter().all(|v| v.is_finite()));
        }
        let (first, second) = (layouts_of(w1s), layouts_of(w2s));
        LAYOUTS.lock().unwrap_or_else(|e| e.into_inner()).clear();
        (first, second)
    }

    #[cfg(feature = "wgpu")]
    #[test]
    fn wgpu_convolutions_get_channels_last_activations_from_the_batch_norm() {
        let _serial = serial();
        set_choice(Choice {
            algo: ConvAlgo::ImplicitGemm,
            kernel: ConvKernel::SimpleSyncCyclic,
            tile: ConvTile::Cmma,
            split: ConvSplit::Auto,
        });
        let results = [
            ("fused", unit_twice::<Autodiff<Wgpu>>()),
            ("plain", unit_twice::<Autodiff<WgpuPlain>>()),
        ];
        set_choice(Choice {
            algo: ConvAlgo::Autotune,
            kernel: ConvKernel::SimpleSyncCyclic,
            tile: ConvTile::Cmma,
            split: ConvSplit::Auto,
        });
        for (backend, (mut first, mut second)) in results {
            first.sort_by_key(|(p, _)| p.name());
            second.sort_by_key(|(p, _)| p.name());
            // (No input gradient for the first: the image batch takes none.)
            let want_first = vec![
                (Pass::Forward, vec![false]),
                (Pass::WeightGrad, vec![false, true]),
            ];
            let want_second = vec![
                (Pass::Forward, vec![true]),
                (Pass::InputGrad, vec![true]),
                (Pass::WeightGrad, vec![true, true]),
            ];
            assert_eq!(
                first, want_first,
                "{backend}: the first convolution's [x] or [x, dy], channels-last?"
            );
            assert_eq!(
                second, want_second,
                "{backend}: the second convolution's [x] or [x, dy], channels-last?"
            );
        }
    }

    #[cfg(feature = "wgpu")]
    type Wgpu = burn::backend::Wgpu;
    #[cfg(feature = "wgpu")]
    type WgpuPlain = CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u32>;

    /// (output, dx, dw) of `sum(conv2d(x, w) * dy)`.
    fn conv_and_grads<B: TrainBackend>(
        x: &TensorData,
        w: &TensorData,
        dy: &TensorData,
        options: &ConvOptions<2>,
    ) -> [Vec<f32>; 3] {
        let device = Default::default();
        let x = Tensor::<B, 4>::from_data(x.clone(), &device).require_grad();
        let w = Tensor::<B, 4>::from_data(w.clone(), &device).require_grad();
        let dy = Tensor::<B, 4>::from_data(dy.clone(), &device);
        let y = conv2d(x.clone(), w.clone(), options.clone());
        let grads = (y.clone() * dy).sum().backward();
        let values = |d: TensorData| d.to_vec::<f32>().unwrap();
        [
            values(y.into_data()),
            values(x.grad(&grads).unwrap().into_data()),
            values(w.grad(&grads).unwrap().into_data()),
        ]
    }

    fn random(dims: [usize; 4]) -> TensorData {
        Tensor::<Flex, 4>::random(dims, Distribution::Normal(0.0, 1.0), &Default::default())
            .into_data()
    }

    /// (output, dx, dw) by the definition, in plain loops (no padding taps, dilation 1).
    fn reference(
        x: &TensorData,
        w: &TensorData,
        dy: &TensorData,
        stride: usize,
        pad: usize,
    ) -> [Vec<f32>; 3] {
        let dims = |d: &TensorData| -> [usize; 4] { d.shape.as_slice().try_into().unwrap() };
        let ([n, c, h, wd], [o, _, k, _], [_, _, ho, wo]) = (dims(x), dims(w), dims(dy));
        let (xv, wv, dyv) = (
            x.to_vec::<f32>().unwrap(),
            w.to_vec::<f32>().unwrap(),
            dy.to_vec::<f32>().unwrap(),
        );
        let (mut y, mut dx, mut dw) = (
            vec![0.0f32; n * o * ho * wo],
            vec![0.0f32; xv.len()],
            vec![0.0f32; wv.len()],
        );
        for (b, oc, i, j, ci, u, v) in (0..n).flat_map(|b| {
            (0..o).flat_map(move |oc| {
                (0..ho).flat_map(move |i| {
                    (0..wo).flat_map(move |j| {
                        (0..c).flat_map(move |ci| {
                            (0..k).flat_map(move |u| (0..k).map(move |v| (b, oc, i, j, ci, u, v)))
                        })
                    })
                })
            })
        }) {
            let (r, q) = (
                (i * stride + u) as isize - pad as isize,
                (j * stride + v) as isize - pad as isize,
            );
            if r < 0 || q < 0 || r as usize >= h || q as usize >= wd {
                continue;
            }
            let xi = ((b * c + ci) * h + r as usize) * wd + q as usize;
            let wi = ((oc * c + ci) * k + u) * k + v;
            let yi = ((b * o + oc) * ho + i) * wo + j;
            y[yi] += xv[xi] * wv[wi];
            dx[xi] += dyv[yi] * wv[wi];
            dw[wi] += dyv[yi] * xv[xi];
        }
        [y, dx, dw]
    }

    #[cfg(feature = "wgpu")]
    /// The premise of `run_pass`'s col2im route: Burn 0.21's direct transposed convolution
    /// returns zeros where `direct_transpose_is_wrong` says, and col2im is right. When a
    /// Burn upgrade fixes the kernel this fails, and the route can go.
    #[test]
    fn wgpu_direct_transposed_convolution_is_what_the_col2im_route_avoids() {
        let device = Default::default();
        let options = ConvOptions::new([2, 2], [0, 0], [1, 1], 1);
        assert!(direct_transpose_is_wrong(
            &Shape::new([8, 4, 1, 1]),
            &options
        ));
        assert!(!direct_transpose_is_wrong(
            &Shape::new([8, 4, 3, 3]),
            &options
        ));
        let (x, w, dy) = (
            random([2, 4, 6, 6]),
            random([8, 4, 1, 1]),
            random([2, 8, 3, 3]),
        );
        let want = reference(&x, &w, &dy, 2, 0)[1].clone();
        let t = |d: &TensorData| {
            Tensor::<WgpuPlain, 4>::from_data(d.clone(), &device)
                .into_primitive()
                .tensor()
        };
        let worst = |strategy| {
            let o = ConvTransposeOptions::new([2, 2], [0, 0], [1, 1], [1, 1], 1);
            let dx = conv_transpose2d(t(&dy), t(&w), None, o, strategy).unwrap();
            let dx =
                Tensor::<WgpuPlain, 4>::from_primitive(burn::tensor::TensorPrimitive::Float(dx));
            let got = dx.into_data().to_vec::<f32>().unwrap();
            got.iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max)
        };
        assert!(worst(ConvTranspose2dStrategy::Gemm) < 1e-3);
        assert!(
            worst(ConvTranspose2dStrategy::Direct) > 0.1,
            "Burn's direct transposed convolution is right here now: the col2im route in run_pass can go"
        );
    }

    #[cfg(feature = "wgpu")]
    #[test]
    fn cubecl_convolution_matches_the_definition_fused_or_not_with_either_strategy() {
        let _serial = serial();
        // (x, weight, stride, padding): a 3×3 stride 1, a strided 3×3 (its input gradient
        // takes Burn's transposed convolution), a strided 1×1 whose taps miss the last row
        // and column (ResNet's downsampling shortcut on an even map).
        // ResNet's other shapes too: a 1×1 stride 1 (the bottleneck's) and a 7×7 stride 2
        // (the ImageNet stem's).
        let cases = [
            ([2, 3, 8, 8], [4, 3, 3, 3], 1, 1),
            ([2, 4, 8, 8], [6, 4, 3, 3], 2, 1),
            ([2, 4, 6, 6], [8, 4, 1, 1], 2, 0),
            ([2, 8, 4, 4], [6, 8, 1, 1], 1, 0),
            ([1, 3, 12, 12], [4, 3, 7, 7], 2, 3),
            // A strided 3×3 without padding on an odd-sized, non-square map: the last
            // column is read by no tap (its input gradient is 0), 5 channels.
            ([2, 5, 9, 8], [6, 5, 3, 3], 2, 0),
        ];
        let mut failures = vec![];
        for _round in 0..3 {
            for (xs, ws, stride, padding) in cases {
                let options = ConvOptions::new([stride; 2], [padding; 2], [1, 1], 1);
                let (x, w) = (random(xs), random(ws));
                let size = |i: usize| (xs[i] + 2 * padding - ws[i]) / stride + 1;
                let dy = random([xs[0], ws[0], size(2), size(3)]);
                let want = reference(&x, &w, &dy, stride, padding);
                let cpu = conv_and_grads::<Autodiff<Flex>>(&x, &w, &dy, &options);
                let mut results = vec![("cpu".to_string(), cpu)];
                let choices = [
                    (ConvAlgo::Autotune, Choice::BURNS, ConvSplit::Auto),
                    // The weight gradient split over the batch (every case here splits:
                    // small weights, and slices of 4 pixels in the tests), then not.
                    (ConvAlgo::ImplicitGemm, Choice::BURNS, ConvSplit::Auto),
                    (ConvAlgo::ImplicitGemm, Choice::BURNS, ConvSplit::Off),
                    // A named kernel: lavapipe refuses it too, so this runs its fallbacks.
                    (
                        ConvAlgo::ImplicitGemm,
                        (ConvKernel::SpecializedTma, ConvTile::Mma),
                        ConvSplit::Off,
                    ),
                ];
                for (algo, (kernel, tile), split) in choices {
                    set_choice(Choice {
                        algo,
                        kernel,
                        tile,
                        split,
                    });
                    let name = format!("{algo:?} {kernel:?} {tile:?} {split:?}");
                    let fused = conv_and_grads::<Autodiff<Wgpu>>(&x, &w, &dy, &options);
                    results.push((format!("fused {name}"), fused));
                    let plain = conv_and_grads::<Autodiff<WgpuPlain>>(&x, &w, &dy, &options);
                    results.push((format!("plain {name}"), plain));
                }
                for (backend, got) in results {
                    for (i, what) in ["output", "input gradient", "weight gradient"]
                        .iter()
                        .enumerate()
                    {
                        assert_eq!(got[i].len(), want[i].len(), "{what}");
                        let bad: Vec<usize> = (0..got[i].len())
                            .filter(|&e| (got[i][e] - want[i][e]).abs() > 1e-3)
                            .collect();
                        if !bad.is_empty() {
                            failures.push(format!(
                                "{backend} {xs:?}*{ws:?} stride {stride}: {what} wrong at {} of {} elements, first {:?}: got {:?}, want {:?}",
                                bad.len(),
                                got[i].len(),
                                &bad[..bad.len().min(6)],
                                bad.iter().take(6).map(|&e| got[i][e]).collect::<Vec<_>>(),
                                bad.iter().take(6).map(|&e| want[i][e]).collect::<Vec<_>>(),
                            ));
                        }
                    }
                }
            }
        }
        set_choice(Choice {
            algo: ConvAlgo::Autotune,
            kernel: ConvKernel::SimpleSyncCyclic,
            tile: ConvTile::Cmma,
            split: ConvSplit::Auto,
        });
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        // The split weight gradients above were the split's, not the implicit GEMM's
        // after a refusal; the strided input gradients the matmul and gather's, not Burn's
        // transposed convolution's.
        for (xs, ws, stride, padding) in cases {
            let options = ConvOptions::new([stride; 2], [padding; 2], [1, 1], 1);
            let (xs, ws) = (Shape::new(xs), Shape::new(ws));
            let mut routes = vec![(Route::Split, Pass::WeightGrad)];
            if stride > 1 {
                routes.push((Route::Gather, Pass::InputGrad));
            }
            for (route, pass) in routes {
                let k = (route, key(pass, Choice::BURNS, &xs, &ws, &options));
                let (ran, refused) =
                    seen(|s| (s.route_ran.contains(&k), s.route_refused.contains(&k)))
                        .expect("the record of shapes");
                assert!(
                    ran && !refused,
                    "{xs:?}*{ws:?}: {route:?} ran {ran}, refused {refused}"
                );
            }
        }
    }

    /// How ResNet-50's weight gradients (CIFAR stem, batch 64) split on an H200 (132
    /// multiprocessors): the small weights of the stem and layer 1 into hundreds of cubes,
    /// the large ones of layer 4 not at all, every slice at least 256 pixels.
    #[test]
    fn resnet50_weight_gradients_split_by_their_size() {
        let h200 = Some(132);
        // (output pixels, out channels, in channels × kernel area, split)
        let cases = [
            (65536, 64, 27, 256),  // stem: 1 block
            (65536, 64, 576, 32),  // layer 1's 3×3: 9 blocks
            (65536, 256, 64, 128), // layer 1's 1×1 up: 4 blocks
            (16384, 128, 1152, 8), // layer 2's 3×3: 36 blocks
            (4096, 256, 2304, 2),  // layer 3's 3×3: 144 blocks
            (1024, 512, 1024, 4),  // layer 4's 1×1 down: 128 blocks, slices of 256
            (1024, 512, 4608, 1),  // layer 4's 3×3: 576 blocks
            (1024, 2048, 1024, 1), // layer 4's shortcut: 512 blocks
            (100, 64, 576, 1),     // too few pixels to slice
        ];
        for (rows, o, patch, want) in cases {
            let got = split_count(rows, o, patch, h200, 256);
            assert_eq!(got, want, "{rows} pixels, {o} × {patch}");
            assert!(got == 1 || rows % got == 0 && rows / got >= 256);
        }
        // Without a multiprocessor count (WebGPU), a target of 64 cubes.
        assert_eq!(split_count(65536, 64, 576, None, 256), 8);
    }

    /// Every named kernel on CUDA (on CMMA tiles; `RUNNER_TEST_CONV_KERNELS` picks others,
    /// e.g. `specialized_tma,simple_async_tma:mma`), fused and plain, against the
    /// definition on ResNet's shapes: a 3×3 stride 1, a 1×1, a 3×3 stride 2. Says for each
    /// which passes ran on the kernel and which it refused (Burn's kernel or autotune took
    /// those). TF32 tensor cores round the operands to 10 bits of mantissa, so the bound is
    /// 1% of the magnitude; a kernel that computes wrong is off by about 100%. Without a
    /// CUDA device it says so and passes.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_named_convolution_kernels_match_the_definition() {
        let _serial = serial();
        type Cuda = burn::backend::Cuda;
        type CudaPlain = CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;
        if !crate::backend::cuda_devices().is_ok_and(|d| !d.is_empty()) {
            eprintln!("no CUDA device here: the named kernels are not checked");
            return;
        }
        let kernels: Vec<(ConvKernel, ConvTile)> = match std::env::var("RUNNER_TEST_CONV_KERNELS") {
            Ok(list) => list
                .split(',')
                .map(|item| {
                    let (name, tile) = item.trim().split_once(':').unwrap_or((item.trim(), "cmma"));
                    let kernel = ConvKernel::ALL
                        .into_iter()
                        .find(|k| k.name() == name)
                        .unwrap_or_else(|| panic!("RUNNER_TEST_CONV_KERNELS: no kernel {name}"));
                    let tile = if tile == "mma" {
                        ConvTile::Mma
                    } else {
                        ConvTile::Cmma
                    };
                    (kernel, tile)
                })
                .collect(),
            Err(_) => ConvKernel::ALL
                .into_iter()
                .map(|k| (k, ConvTile::Cmma))
                .collect(),
        };
        let cases = [
            ([4, 64, 8, 8], [64, 64, 3, 3], 1, 1),
            ([4, 64, 8, 8], [128, 64, 1, 1], 1, 0),
            ([4, 64, 8, 8], [128, 64, 3, 3], 2, 1),
        ];
        let inputs: Vec<_> = cases
            .iter()
            .map(|&(xs, ws, stride, padding)| {
                let (x, w) = (random(xs), random(ws));
                let size = |i: usize| (xs[i] + 2 * padding - ws[i]) / stride + 1;
                let dy = random([xs[0], ws[0], size(2), size(3)]);
                let want = reference(&x, &w, &dy, stride, padding);
                let options = ConvOptions::new([stride; 2], [padding; 2], [1, 1], 1);
                (x, w, dy, options, want)
            })
            .collect();
        // Every weight gradient on the named kernel, none split; then Burn's kernel with
        // the weight gradients split over the batch (`conv_split = "auto"`; these small
        // weights all split, with the tests' slices of at least 4 pixels).
        let mut runs: Vec<_> = kernels
            .into_iter()
            .map(|(k, t)| (k, t, ConvSplit::Off))
            .collect();
        runs.push((
            ConvKernel::SimpleSyncCyclic,
            ConvTile::Cmma,
            ConvSplit::Auto,
        ));
        let mut failures = vec![];
        for (kernel, tile, split) in runs {
            set_choice(Choice {
                algo: ConvAlgo::ImplicitGemm,
                kernel,
                tile,
                split,
            });
            let mut worst = 0.0f32;
            for (x, w, dy, options, want) in &inputs {
                let fused = conv_and_grads::<Autodiff<Cuda>>(x, w, dy, options);
                let plain = conv_and_grads::<Autodiff<CudaPlain>>(x, w, dy, options);
                for (how, got) in [("fused", fused), ("plain", plain)] {
                    for (i, what) in ["output", "input gradient", "weight gradient"]
                        .iter()
                        .enumerate()
                    {
                        let err = got[i]
                            .iter()
                            .zip(&want[i])
                            .map(|(g, r)| (g - r).abs() / (1.0 + r.abs()))
                            .fold(0.0f32, f32::max);
                        worst = worst.max(err);
                        if err.is_nan() || err > 1e-2 {
                            failures.push(format!(
                                "{} {} (conv_split {}) {how} {:?} by {:?} stride {:?}: {what} off by {err:.3} of its magnitude",
                                kernel.name(),
                                tile.name(),
                                split.name(),
                                x.shape,
                                w.shape,
                                options.stride
                            ));
                        }
                    }
                }
            }
            let refused: Vec<&str> = [Pass::Forward, Pass::InputGrad, Pass::WeightGrad]
                .into_iter()
                .filter(|&p| {
                    seen(|s| s.refused.iter().any(|k| k.0 == p && k.1 == (kernel, tile)))
                        .unwrap_or(false)
                })
                .map(Pass::name)
                .collect();
            let split_ran = inputs
                .iter()
                .filter(|(x, w, _, options, _)| {
                    let k = key(Pass::WeightGrad, Choice::BURNS, &x.shape, &w.shape, options);
                    let k = (Route::Split, k);
                    seen(|s| s.route_ran.contains(&k) && !s.route_refused.contains(&k))
                        .unwrap_or(false)
                })
                .count();
            eprintln!(
                "conv kernel {} on {} (conv_split {}): worst relative error {worst:.1e}; refused (ran elsewhere): {}{}",
                kernel.name(),
                tile.name(),
                split.name(),
                if refused.is_empty() { "none".to_string() } else { refused.join(", ") },
                if split == ConvSplit::Auto {
                    format!("; weight gradients split for {split_ran} of {} shapes", inputs.len())
                } else {
                    String::new()
                }
            );
            if split == ConvSplit::Auto && split_ran != inputs.len() {
                failures.push(format!(
                    "conv_split auto: the weight gradient was split for {split_ran} of {} shapes",
                    inputs.len()
                ));
            }
        }
        set_choice(Choice {
            algo: ConvAlgo::Autotune,
            kernel: ConvKernel::SimpleSyncCyclic,
            tile: ConvTile::Cmma,
            split: ConvSplit::Auto,
        });
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
