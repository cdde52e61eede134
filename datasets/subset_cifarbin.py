#!/usr/bin/env python3
"""Take a class-balanced subset of a CIFAR-10 binary file: the first N records of each
class, kept in file order. Standard library only; byte-exact and repeatable.

    python3 datasets/subset_cifarbin.py SRC DST PER_CLASS [CLASSES]
"""
import sys

RECORD = 1 + 3 * 32 * 32


def main():
    src, dst, per_class = sys.argv[1], sys.argv[2], int(sys.argv[3])
    classes = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    data = open(src, "rb").read()
    if len(data) % RECORD:
        sys.exit(f"{src}: not a whole number of {RECORD}-byte records")
    kept, counts = [], [0] * classes
    for off in range(0, len(data), RECORD):
        label = data[off]
        if counts[label] < per_class:
            counts[label] += 1
            kept.append(data[off:off + RECORD])
    if min(counts) < per_class:
        sys.exit(f"{src}: only {min(counts)} records of some class")
    open(dst, "wb").write(b"".join(kept))
    print(f"{dst}: {len(kept)} records, {per_class} per class")


if __name__ == "__main__":
    main()
