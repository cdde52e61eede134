#!/usr/bin/env bash
# Tests must run the code users build. Cargo unifies the features of a crate over the
# normal and the dev-dependencies when it builds tests, so a dev-dependency can turn on a
# feature that `cargo build --release` leaves off, and the tests then pass on code the
# users never run. It happened: jsonschema (a dev-dependency) turned on serde_json's
# `float_roundtrip` for tests only; the released binary read about 1 float in 11 one bit
# off and refused every checkpoint of a run that recorded evaluations, while every resume
# test passed. This fails on any crate that gains a feature in the test build, except the
# ones listed below, which only jsonschema itself uses (it validates the schema in tests).
set -euo pipefail
cd "$(dirname "$0")/.."
tree() { cargo tree --offline -e "$1" -f '{p} {f}' --prefix none 2>/dev/null || cargo tree -e "$1" -f '{p} {f}' --prefix none; }
tree features,normal,build > "${TMPDIR:-/tmp}/features-normal.txt"
tree features,normal,build,dev > "${TMPDIR:-/tmp}/features-test.txt"
python3 - "${TMPDIR:-/tmp}/features-normal.txt" "${TMPDIR:-/tmp}/features-test.txt" <<'PY'
import sys
# Crates whose extra test-build features come from jsonschema's own dependencies and change
# nothing the runner reads or writes (regular expressions, hashing, encodings).
ALLOWED = {"ahash", "aho-corasick", "data-encoding", "hashbrown", "memchr", "num-complex",
           "parking_lot", "regex", "regex-automata", "regex-syntax"}
def load(path):
    out = {}
    for line in open(path):
        parts = line.split()
        if len(parts) < 2 or parts[0] == "runner" or parts[1] == "feature":
            continue
        feats = set(parts[2].split(",")) if len(parts) > 2 and not parts[2].startswith("(") else set()
        out.setdefault((parts[0], parts[1]), set()).update(feats)
    return out
normal, test = load(sys.argv[1]), load(sys.argv[2])
bad = [(name, ver, sorted(test[(name, ver)] - feats))
       for (name, ver), feats in sorted(normal.items())
       if (name, ver) in test and test[(name, ver)] - feats and name not in ALLOWED]
for name, ver, extra in bad:
    print(f"error: {name} {ver} gets {', '.join(extra)} only in the test build (from a dev-dependency)")
if bad:
    print("  = help: turn the feature on in [dependencies] too, so the tests run what users build")
    sys.exit(1)
print(f"features match: {len(normal)} crates, none with a feature only the tests get"
      f" (apart from {len(ALLOWED)} of jsonschema's own)")
PY
