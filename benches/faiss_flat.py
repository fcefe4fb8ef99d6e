#!/usr/bin/env python3
"""Reference figures for `cargo bench --bench kernels`: faiss's exact flat scans on one core.

Prints one JSON object: rows/s of IndexBinaryFlat (binary codes of `--binary-bits`, Hamming,
k=10; the kernels benchmark passes the size of its 2-bit code, 2 bits per dimension) and of
IndexScalarQuantizer QT_8bit (int8-sized codes, inner product, k=10) for one query over
random data of the same shape as the Rust benchmark. The kernels benchmark runs this script in
the same process run when PERPETUITY_FAISS_PYTHON names a Python with faiss-cpu and numpy:

    python3 -m venv /tmp/bench-venv && /tmp/bench-venv/bin/pip install faiss-cpu numpy
    PERPETUITY_FAISS_PYTHON=/tmp/bench-venv/bin/python cargo bench --bench kernels
"""

import argparse
import json
import time

import faiss
import numpy as np


def median_seconds(run, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dims", type=int, default=256)
    parser.add_argument("--binary-bits", type=int, default=512)
    parser.add_argument("--code-rows", type=int, default=8 << 20)
    parser.add_argument("--int8-rows", type=int, default=1 << 20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    faiss.omp_set_num_threads(1)
    rng = np.random.default_rng(7)

    binary = faiss.IndexBinaryFlat(args.binary_bits)
    binary.add(rng.integers(0, 256, size=(args.code_rows, args.binary_bits // 8), dtype=np.uint8))
    query = rng.integers(0, 256, size=(1, args.binary_bits // 8), dtype=np.uint8)
    binary_s = median_seconds(lambda: binary.search(query, 10), args.repeats)
    del binary

    sq8 = faiss.IndexScalarQuantizer(args.dims, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
    data = rng.standard_normal(size=(args.int8_rows, args.dims), dtype=np.float32)
    sq8.train(data[:65536])
    sq8.add(data)
    del data
    fquery = rng.standard_normal(size=(1, args.dims), dtype=np.float32)
    sq8_s = median_seconds(lambda: sq8.search(fquery, 10), args.repeats)

    print(json.dumps({
        "faiss_version": faiss.__version__,
        "binary_bits": args.binary_bits,
        "binary_flat_rows_per_s": args.code_rows / binary_s,
        "sq8_flat_rows_per_s": args.int8_rows / sq8_s,
    }))


if __name__ == "__main__":
    main()
