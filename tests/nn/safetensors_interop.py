#!/usr/bin/env python3
"""weft's safetensors files against Python's safetensors, both ways.

Usage: safetensors_interop.py PATH/TO/test_safetensors

1. test_safetensors writes weft.safetensors (its skipped case "interop weft writes");
   here Python's safetensors loads it and checks names, dtypes, shapes, values, metadata
   and the alignment of every tensor.
2. Python writes python.safetensors with safetensors.numpy.save_file (and a float16 file);
   test_safetensors ("interop weft reads") loads them and checks the same table.

The table of values is duplicated in interop_tensors() of test_safetensors.cpp.
Exits 77 (CTest's skip code) when safetensors or numpy cannot be imported.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file
except ImportError as error:
    print(f"skipped: {error} (tools/install-deps pip-installs safetensors and numpy)")
    sys.exit(77)


def expected_tensors():
    return {
        "f32": (np.arange(12, dtype=np.float32).reshape(3, 4) * np.float32(0.25) - np.float32(1.5)),
        "f64": 1.0 / (np.arange(6, dtype=np.float64) + 1).reshape(2, 3),
        "i64": np.array([-1099511627776, 0, 1099511627783, 2**63 - 1], dtype=np.int64),
        "i32": np.array([-(2**31), -1, 0, 2**31 - 1], dtype=np.int32),
        "u8": np.array([0, 1, 127, 128, 255], dtype=np.uint8),
        "bool": np.array([[True, False], [False, True]]),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "f16": np.array([-65504, 2.0**-24, 1.0 / 3, 0.1], dtype=np.float16),
    }


def run_case(binary, case, directory):
    env = dict(os.environ, WEFT_SAFETENSORS_INTEROP_DIR=directory)
    result = subprocess.run([binary, "--no-skip", f"--test-case={case}"], env=env, capture_output=True, text=True)
    output = result.stdout + result.stderr
    # A filter that matches nothing also exits 0: insist that exactly this case ran.
    if result.returncode != 0 or "test cases: 1 | 1 passed" not in " ".join(output.split()):
        sys.exit(f"FAILED: test_safetensors case '{case}' (exit {result.returncode}):\n{output}")


def check_weft_file(path):
    tensors = load_file(path)
    expected = expected_tensors()
    assert sorted(tensors) == sorted(expected), f"names {sorted(tensors)} != {sorted(expected)}"
    for name, want in expected.items():
        got = tensors[name]
        assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
        assert np.array_equal(got, want), f"{name}: values {got} != {want}"
    with safe_open(path, framework="np") as f:
        metadata = f.metadata()
    assert metadata == {"format": "pt", "written_by": "weft"}, f"metadata {metadata}"

    # The raw layout: a header padded to 8 bytes, every tensor aligned to its element size.
    with open(path, "rb") as f:
        raw = f.read()
    (header_size,) = struct.unpack("<Q", raw[:8])
    assert header_size % 8 == 0, f"header length {header_size} is not a multiple of 8"
    header = json.loads(raw[8 : 8 + header_size])
    for name, info in header.items():
        if name != "__metadata__":
            begin = info["data_offsets"][0]
            assert begin % expected[name].itemsize == 0, f"{name}: offset {begin} is not aligned"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="weft_safetensors_interop_") as directory:
        run_case(binary, "interop weft writes", directory)
        check_weft_file(os.path.join(directory, "weft.safetensors"))

        save_file(expected_tensors(), os.path.join(directory, "python.safetensors"), metadata={"written_by": "python"})
        save_file({"half": np.array([1, -0.5, 65504, 2.0**-24], dtype=np.float16)},
                  os.path.join(directory, "python_f16.safetensors"))
        run_case(binary, "interop weft reads", directory)
    print("safetensors interop: Python reads weft's file and weft reads Python's")


if __name__ == "__main__":
    main()
