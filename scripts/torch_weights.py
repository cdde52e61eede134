#!/usr/bin/env python3
"""torch_weights.py: a runner run's trained weights in PyTorch, and a check that PyTorch
scores them as the runner does.

What it is
    `runner` saves a run's weights as `model.safetensors` under Burn's names and layouts
    (`ResNet.blocks.3.convs.1.bn.gamma`; a Linear's weight as [in, out]). This script maps
    them onto the PyTorch model scripts/torch_ref.py builds for the run's recipe
    (torchvision's ResNets, with the CIFAR stem where the recipe has it; the small CNN and
    the MLP as src/model.rs), one to one: every tensor of either side is used, or it stops
    and names what did not map (exit 1).

Run
    python3 scripts/torch_weights.py RUN_DIR [--best] [--out FILE.pt] [--check [--data FILE]]
      --best          model-best.safetensors (the best validation's weights) in place of
                      model.safetensors
      --out FILE.pt   the model's state_dict, for `model.load_state_dict(torch.load(FILE))`
                      on the model torch_ref.build_model builds (for the ResNets:
                      torchvision.models.resnetNN(num_classes=K) with, for the CIFAR stem,
                      conv1 = Conv2d(C, 64, 3, 1, 1, bias=False) and maxpool = Identity())
      --check         score the weights in PyTorch (eval mode, fp32, CPU) on the run's test
                      set, or on --data FILE, normalised as the recipe says; prints one JSON
                      line (with the file scored) to compare with
                      `runner eval RUN_DIR [--best] [--data FILE]`; cifar10-bin runs only
                      (a synthetic run's test set is the runner's own draws)
    A weights file that is not the one the run saved (summary.json's weights_sha256 or
    best_weights_sha256) is said on stderr, as `runner eval` says it.
    Install: python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch torchvision
    safetensors numpy.  Image recipes only (cifar10-bin and synthetic data).  Exit codes: 0
    done, 1 the weights do not map onto the model, 2 a run or option it does not take.

Measured with it: BENCHMARKS.md, "Correctness against PyTorch".
"""

import argparse
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def torch_ref():
    """scripts/torch_ref.py, for its recipe reader, data reader and models."""
    spec = importlib.util.spec_from_file_location("torch_ref", os.path.join(HERE, "torch_ref.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


RESNET_BLOCKS = {"resnet18": [2, 2, 2, 2], "resnet34": [3, 4, 6, 3], "resnet50": [3, 4, 6, 3]}


def bn(torch_prefix, burn_prefix):
    return {
        f"{torch_prefix}.weight": (f"{burn_prefix}.bn.gamma", False),
        f"{torch_prefix}.bias": (f"{burn_prefix}.bn.beta", False),
        f"{torch_prefix}.running_mean": (f"{burn_prefix}.bn.running_mean", False),
        f"{torch_prefix}.running_var": (f"{burn_prefix}.bn.running_var", False),
    }


def names(rc):
    """torch state_dict key -> (runner tensor name, transposed?), for torch_ref's models."""
    out = {}
    if rc.arch == "small_cnn":
        # nn.Sequential: 0 conv, 1 bn, (relu, pool), 4 conv, 5 bn, (relu, pool, flatten),
        # 9 linear, (relu), 11 linear.
        for i, (conv, norm) in enumerate([(0, 1), (4, 5)], start=1):
            out[f"{conv}.weight"] = (f"SmallCnn.c{i}.conv.weight", False)
            out.update(bn(str(norm), f"SmallCnn.c{i}"))
        for layer, name in [(9, "fc1"), (11, "fc2")]:
            out[f"{layer}.weight"] = (f"SmallCnn.{name}.weight", True)
            out[f"{layer}.bias"] = (f"SmallCnn.{name}.bias", False)
    elif rc.arch == "mlp":
        # nn.Sequential: 0 flatten, then linear, relu, linear, ...: linear i at 1 + 2i.
        for i in range(len(rc.hidden) + 1):
            out[f"{1 + 2 * i}.weight"] = (f"Mlp.layers.{i}.weight", True)
            out[f"{1 + 2 * i}.bias"] = (f"Mlp.layers.{i}.bias", False)
    else:
        out["conv1.weight"] = ("ResNet.stem.conv.weight", False)
        out.update(bn("bn1", "ResNet.stem"))
        convs = 3 if rc.arch == "resnet50" else 2
        block = 0
        for stage, count in enumerate(RESNET_BLOCKS[rc.arch], start=1):
            for i in range(count):
                t, b = f"layer{stage}.{i}", f"ResNet.blocks.{block}"
                for c in range(convs):
                    out[f"{t}.conv{c + 1}.weight"] = (f"{b}.convs.{c}.conv.weight", False)
                    out.update(bn(f"{t}.bn{c + 1}", f"{b}.convs.{c}"))
                out[f"{t}.downsample.0.weight"] = (f"{b}.downsample.conv.weight", False)
                out.update(bn(f"{t}.downsample.1", f"{b}.downsample"))
                block += 1
        out["fc.weight"] = ("ResNet.fc.weight", True)
        out["fc.bias"] = ("ResNet.fc.bias", False)
    return out


def head_classes(rc, path):
    """The class count the run trained: the length of its last layer's bias, read from the
    weights file's header (the training folder's batches.meta.txt may have changed since,
    and a run with data.validation_file names no folder torch_ref reads). None where the
    header does not say."""
    head = {"small_cnn": "SmallCnn.fc2.bias", "mlp": f"Mlp.layers.{len(rc.hidden)}.bias"}.get(
        rc.arch, "ResNet.fc.bias")
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        return int(header[head]["shape"][0])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def sha256(path):
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load(net, rc, path):
    """`net` with the run's weights; exits 1 naming what does not map."""
    import numpy as np
    import torch
    from safetensors.numpy import load_file

    saved = load_file(path)
    state = net.state_dict()
    mapping = names(rc)
    used, problems = set(), []
    for key, value in state.items():
        if key.endswith("num_batches_tracked"):
            continue  # torch's counter of BN updates; the runner keeps none
        if key not in mapping or mapping[key][0] not in saved:
            problems.append(f"{key}: no tensor in {path}")
            continue
        name, transposed = mapping[key]
        a = saved[name].T if transposed else saved[name]
        if tuple(a.shape) != tuple(value.shape):
            problems.append(f"{key}: {tuple(a.shape)} in the file ({name}), {tuple(value.shape)} in torch")
            continue
        state[key] = torch.from_numpy(np.ascontiguousarray(a))
        used.add(name)
    problems += [f"{name}: in the file, not in the torch model" for name in sorted(set(saved) - used)]
    if problems:
        print(f"torch_weights: {len(problems)} tensor(s) do not map:", file=sys.stderr)
        for p in problems[:20]:
            print(f"  {p}", file=sys.stderr)
        sys.exit(1)
    net.load_state_dict(state)
    return net, len(used)


def main(argv=None):
    p = argparse.ArgumentParser(description="A runner run's weights in PyTorch.")
    p.add_argument("run_dir", help="the run directory (runs/<name>/<run-id>)")
    p.add_argument("--out", help="write the torch state_dict here (.pt)")
    p.add_argument("--check", action="store_true", help="score them in PyTorch; one JSON line")
    p.add_argument("--data", help="with --check: this test file instead of the run's")
    p.add_argument("--best", action="store_true", help="model-best.safetensors")
    args = p.parse_args(argv)
    tr = torch_ref()
    weights = os.path.join(args.run_dir, "model-best.safetensors" if args.best else "model.safetensors")
    recipe_file = os.path.join(args.run_dir, "recipe.toml")
    if not os.path.isfile(recipe_file):
        print(f"torch_weights: {recipe_file}: not a file (give a run directory)", file=sys.stderr)
        return 2
    if not os.path.isfile(weights):
        why = ("the run kept no best weights (it needs data.validation)" if args.best
               else "the run saved no final weights (still going, stopped early, or "
                    "checkpoint.save_final = false)")
        print(f"torch_weights: {weights}: not a file: {why}", file=sys.stderr)
        return 2
    if args.data and not args.check:
        print("torch_weights: --data goes with --check", file=sys.stderr)
        return 2
    try:
        ns = argparse.Namespace(max_steps=None, warmup_steps=None)
        recipe = tr.load_toml(os.path.join(args.run_dir, "recipe.toml"))
        # Nothing is trained here: the validation set torch_ref cannot train with is not
        # read (such runs were refused, even for --out).
        recipe.get("data", {}).pop("validation_file", None)
        rc = tr.Recipe(recipe, ns)
    except tr.Unsupported as e:
        print(f"torch_weights: {e}", file=sys.stderr)
        return 2

    import torch

    torch.set_num_threads(max(1, rc.threads or os.cpu_count() or 1))
    if rc.format == "synthetic":
        # The model's shape from the recipe; no test set here: torch_ref's synthetic pixels
        # are numpy's draws, not the runner's, and `runner eval --data` takes none either.
        if args.check:
            print("torch_weights: --check takes cifar10-bin runs: a synthetic run's test set "
                  "is the runner's own draws (--out works)", file=sys.stderr)
            return 2
        channels, side = rc.syn["channels"], rc.syn["image_size"]
        classes = head_classes(rc, weights) or rc.num_classes or rc.syn["classes"]
    else:
        channels, side = 3, 32
        classes = head_classes(rc, weights) or rc.num_classes or tr.class_count(rc.train_path)
    net = tr.build_model(rc, channels, side, classes)
    net, tensors = load(net, rc, weights)
    # As `runner eval` does: the file checked against the sum the run recorded.
    digest = sha256(weights)
    try:
        with open(os.path.join(args.run_dir, "summary.json")) as f:
            recorded = json.load(f).get("best_weights_sha256" if args.best else "weights_sha256")
    except (OSError, ValueError):
        recorded = None
    if recorded and recorded != digest:
        print(f"torch_weights: warning: {weights} is not the file the run saved (SHA-256 "
              f"{digest[:12]}…, the run's {recorded[:12]}…): damaged or replaced since",
              file=sys.stderr)
    if args.out:
        torch.save(net.state_dict(), args.out)
        print(f"torch_weights: {tensors} tensors -> {args.out}", file=sys.stderr)
    if not args.check:
        return 0
    import torch.nn.functional as F

    test_path = args.data or rc.test_path
    if not test_path:
        print("torch_weights: the run has no test set; give --data FILE", file=sys.stderr)
        return 2
    test_px, test_y = tr.read_cifar(test_path, "test_batch", None if args.data else rc.test_limit)
    x = torch.from_numpy(test_px).float() / 255.0
    mean = torch.tensor(tr.widen(rc.mean, channels)).view(1, channels, 1, 1)
    std = torch.tensor(tr.widen(rc.std, channels)).view(1, channels, 1, 1)
    x = (x - mean) / std
    y = torch.from_numpy(test_y)
    net.eval()
    with torch.no_grad():
        logits = torch.cat([net(x[i:i + 256]) for i in range(0, len(x), 256)])
    print(json.dumps({
        "run_dir": os.path.abspath(args.run_dir),
        "weights": os.path.abspath(weights),
        "weights_sha256": digest,
        "weights_as_saved": None if not recorded else recorded == digest,
        "arch": rc.arch,
        "samples": len(y),
        "accuracy": (logits.argmax(1) == y).float().mean().item(),
        "loss": F.cross_entropy(logits, y).item(),
        "parameters": sum(t.numel() for t in net.parameters()),
        "torch": torch.__version__,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
