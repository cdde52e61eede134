//! Work of the runner's own queued on CubeCL's fused backend: a custom operation of
//! fusion's stream, whose inputs and outputs fusion tracks as it does its own ops', and
//! which runs, when fusion executes the stream, a function of its input tensors on the
//! plain backend. The convolutions (`conv_cube`), the batch norm's kernels (`norm_cube`)
//! and the convolution weights' layouts and optimizer steps (`conv_cube`, `optim`) are
//! queued through it.

use std::marker::PhantomData;

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

/// The float32 backends the runner builds on a CubeCL runtime.
type Cube<R, BT> = CubeBackend<R, f32, i32, BT>;

/// A queued custom operation: `run` takes the inputs' tensors in `desc`'s order and
/// returns one tensor for each of `desc`'s outputs, in order.
struct Queued<R, BT, F> {
    desc: CustomOpIr,
    run: F,
    _b: PhantomData<(R, BT)>,
}

impl<R, BT, F> std::fmt::Debug for Queued<R, BT, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queued").field("desc", &self.desc).finish()
    }
}

impl<R: CubeRuntime, BT: BoolElement, F> Operation<<Cube<R, BT> as FusionBackend>::FusionRuntime>
    for Queued<R, BT, F>
where
    F: Fn(Vec<CubeTensor<R>>) -> Vec<CubeTensor<R>> + Send + Sync + 'static,
{
    fn execute(
        &self,
        handles: &mut HandleContainer<
            <<Cube<R, BT> as FusionBackend>::FusionRuntime as FusionRuntime>::FusionHandle,
        >,
    ) {
        let inputs = (self.desc.inputs.iter())
            .map(|t| handles.get_float_tensor::<Cube<R, BT>>(t))
            .collect();
        for (ir, out) in self.desc.outputs.iter().zip((self.run)(inputs)) {
            handles.register_float_tensor::<Cube<R, BT>>(&ir.id, out);
        }
    }
}

/// Queues `run` on `inputs` (at least one) as the custom operation `name`, with outputs
/// of these shapes and types: the outputs' tensors, in order. `name` should tell apart
/// what `run` does differently for the same inputs (fusion matches a stream's operations
/// by their descriptions to replay what it planned for them).
pub(crate) fn queue<R, BT, F>(
    name: &'static str,
    inputs: Vec<FloatTensor<Fusion<Cube<R, BT>>>>,
    outputs: &[(Shape, DType)],
    run: F,
) -> Vec<FloatTensor<Fusion<Cube<R, BT>>>>
where
    R: CubeRuntime,
    BT: BoolElement,
    F: Fn(Vec<CubeTensor<R>>) -> Vec<CubeTensor<R>> + Send + Sync + 'static,
{
    let client = inputs[0].client.clone();
    let mut streams = OperationStreams::default();
    for t in &inputs {
        streams.tensor(t);
    }
    let inputs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let outputs: Vec<TensorIr> = (outputs.iter())
        .map(|(shape, dtype)| TensorIr::uninit(client.create_empty_handle(), shape.clone(), *dtype))
        .collect();
    let desc = CustomOpIr::new(name, &inputs, &outputs);
    let op = Queued::<R, BT, F> {
        desc: desc.clone(),
        run,
        _b: PhantomData,
    };
    client.register(streams, OperationIr::Custom(desc), op)
}
