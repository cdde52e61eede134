#!/usr/bin/env python3
"""torch_conv.py: PyTorch's CPU convolution layer by layer, the table `cargo bench --bench conv`
prints for the runner's (same layers, same batch, same threads, median of 5 after a warm-up).

    python3 scripts/torch_conv.py [resnet18|resnet50 [BATCH [THREADS]]]

Install: see scripts/torch_ref.py (PyPI's torch wheel runs on a CPU-only host).
"""
import sys
import time

import torch


def resnet18():
    layers, side, cin = [(3, 64, 3, 1, 32)], 32, 64
    for i, width in enumerate([64, 128, 256, 512]):
        for block in range(2):
            stride = 2 if i > 0 and block == 0 else 1
            layers.append((cin, width, 3, stride, side))
            if stride == 2:
                layers.append((cin, width, 1, 2, side))
                side //= 2
            layers.append((width, width, 3, 1, side))
            cin = width
    return layers


def resnet50():
    layers, side, cin = [(3, 64, 3, 1, 32)], 32, 64
    for i, (width, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)]):
        for block in range(blocks):
            stride = 2 if i > 0 and block == 0 else 1
            layers.append((cin, width, 1, 1, side))
            layers.append((width, width, 3, stride, side))
            if block == 0:
                layers.append((cin, width * 4, 1, stride, side))
            side //= stride
            layers.append((width, width * 4, 1, 1, side))
            cin = width * 4
    return layers


def median_ms(f):
    f()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        f()
        times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[2]


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else "resnet18"
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    torch.set_num_threads(threads)
    layers = {"resnet18": resnet18, "resnet50": resnet50}[model]()
    print(f"# {model}, batch {batch}, {threads} threads, torch {torch.__version__}: ms per call (median of 5)")
    print("| layer | cin→cout | k | s | side | forward | dx | dw |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    total = [0.0, 0.0, 0.0]
    with torch.no_grad():
        for i, (cin, cout, k, s, side) in enumerate(layers):
            x = torch.rand(batch, cin, side, side)
            w = torch.rand(cout, cin, k, k)
            y = torch.nn.functional.conv2d(x, w, None, s, k // 2)
            dy = torch.rand_like(y)
            args = (dy, x, w, None, [s, s], [k // 2, k // 2], [1, 1], False, [0, 0], 1)
            t = [
                median_ms(lambda: torch.nn.functional.conv2d(x, w, None, s, k // 2)),
                median_ms(lambda: torch.ops.aten.convolution_backward(*args, [True, False, False])),
                median_ms(lambda: torch.ops.aten.convolution_backward(*args, [False, True, False])),
            ]
            print(f"| {i} | {cin}→{cout} | {k} | {s} | {side} | {t[0]:.2f} | {t[1]:.2f} | {t[2]:.2f} |")
            total = [a + b for a, b in zip(total, t)]
    print(f"| all | | | | | {total[0]:.1f} | {total[1]:.1f} | {total[2]:.1f} |\n\ntotal {sum(total):.1f} ms")


if __name__ == "__main__":
    main()
