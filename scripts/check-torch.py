#!/usr/bin/env python3
"""Reproduce castor's test accuracy from a castor checkpoint in PyTorch.

    python3 scripts/check-torch.py model.safetensors [FASHION_MNIST_DIR]

The checkpoint is read with safetensors.torch.load_file when that package is
importable, and otherwise by its documented layout (8-byte little-endian
header length, JSON header, raw little-endian float32 data), which is what a
castor checkpoint is. The model is rebuilt from the header's metadata:
dense_i.kernel is (in, out) row-major, y = act(x @ kernel + bias).
No castor code is used.
"""
import gzip
import json
import struct
import sys

import torch


def load_by_layout(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n :]
    tensors = {}
    for name, t in header.items():
        assert t["dtype"] == "F32", (name, t["dtype"])
        b, e = t["data_offsets"]
        tensors[name] = torch.frombuffer(bytearray(data[b:e]), dtype=torch.float32).reshape(
            t["shape"]
        )
    return tensors, meta, "by its documented layout"


def load(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(n)).get("__metadata__", {})
    try:
        from safetensors.torch import load_file

        return load_file(path), meta, "with safetensors.torch.load_file"
    except ImportError:
        return load_by_layout(path)


def idx(path):
    with gzip.open(path) if path.endswith(".gz") else open(path, "rb") as f:
        raw = f.read()
    rank = raw[3]
    dims = struct.unpack(">" + "I" * rank, raw[4 : 4 + 4 * rank])
    return torch.frombuffer(bytearray(raw[4 + 4 * rank :]), dtype=torch.uint8).reshape(dims)


def main():
    path = sys.argv[1]
    data_dir = sys.argv[2] if len(sys.argv) > 2 else "/usr/share/datasets/fashion-mnist"
    tensors, meta, how = load(path)
    acts = {"linear": lambda z: z, "relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}
    layers = [item.split(":") for item in meta["layers"].split(",")]
    x = idx(f"{data_dir}/t10k-images-idx3-ubyte.gz").reshape(10000, -1).float() / 255.0
    y = idx(f"{data_dir}/t10k-labels-idx1-ubyte.gz").long()
    with torch.no_grad():
        for i, (units, act) in enumerate(layers):
            kernel, bias = tensors[f"dense_{i}.kernel"], tensors[f"dense_{i}.bias"]
            assert kernel.shape == (x.shape[1], int(units)), kernel.shape
            x = acts[act](x @ kernel + bias)
        loss = torch.nn.functional.cross_entropy(x, y).item()
        accuracy = (x.argmax(dim=1) == y).float().mean().item()
    print(f"loaded {path} {how} (torch {torch.__version__}); layers {meta['layers']}, "
          f"step {meta.get('step')}")
    print(f"pytorch test_accuracy {accuracy:.4f} test_loss {loss:.4f}")


if __name__ == "__main__":
    main()
