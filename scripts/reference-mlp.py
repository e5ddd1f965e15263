#!/usr/bin/env python3
"""What the demo's recipe reaches without castor: the same model trained by a
few lines of numpy, to judge castor's Fashion-MNIST accuracy against.

    scripts/reference-mlp.py [--epochs 10] [--batch 256] [--hidden 128] SEED...

The recipe of `castor train --data fashion-mnist --layers 128:relu,10
--epochs 10 --batch 256` with castor's (Keras's) defaults: pixels / 255,
Glorot-uniform weights and zero biases, softmax cross-entropy averaged over
the batch, Adam (lr 1e-3, beta1 0.9, beta2 0.999, epsilon 1e-7 added to
sqrt(v) before the bias correction), the data reshuffled every epoch and the
last partial batch kept. Its own random numbers (numpy's), so its seeds do
not match castor's runs one to one: compare the spread over many seeds.
Prints each seed's test accuracy, then their mean, standard deviation and
range. Reads $CASTOR_FASHION_MNIST, else /usr/share/datasets/fashion-mnist.
"""
import argparse
import gzip
import os
import statistics

import numpy as np


def idx(directory, name, header):
    with gzip.open(os.path.join(directory, name)) as f:
        return np.frombuffer(f.read(), np.uint8, offset=header)


def load(directory):
    def images(name):
        return idx(directory, name, 16).reshape(-1, 784).astype(np.float32) / 255

    def labels(name):
        return idx(directory, name, 8).astype(np.int64)

    return (images("train-images-idx3-ubyte.gz"), labels("train-labels-idx1-ubyte.gz"),
            images("t10k-images-idx3-ubyte.gz"), labels("t10k-labels-idx1-ubyte.gz"))


def glorot(rng, fan_in, fan_out):
    limit = np.sqrt(6 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)


def train(data, seed, epochs, batch, hidden):
    x_train, y_train, x_test, y_test = data
    rng = np.random.default_rng(seed)
    params = [glorot(rng, 784, hidden), np.zeros(hidden, np.float32),
              glorot(rng, hidden, 10), np.zeros(10, np.float32)]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(x_train))
        for start in range(0, len(x_train), batch):
            rows = order[start:start + batch]
            x, y, n = x_train[rows], y_train[rows], len(rows)
            h = np.maximum(x @ params[0] + params[1], 0)
            z = h @ params[2] + params[3]
            z -= z.max(1, keepdims=True)
            dz = np.exp(z)
            dz /= dz.sum(1, keepdims=True)
            dz[np.arange(n), y] -= 1
            dz /= n
            dh = (dz @ params[2].T) * (h > 0)
            grads = [x.T @ dh, dh.sum(0), h.T @ dz, dz.sum(0)]
            step += 1
            lr = 1e-3 * np.sqrt(1 - 0.999 ** step) / (1 - 0.9 ** step)
            for k, g in enumerate(grads):
                m[k] = 0.9 * m[k] + 0.1 * g
                v[k] = 0.999 * v[k] + 0.001 * g * g
                params[k] -= lr * m[k] / (np.sqrt(v[k]) + 1e-7)
    h = np.maximum(x_test @ params[0] + params[1], 0)
    return float(((h @ params[2] + params[3]).argmax(1) == y_test).mean())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("seeds", type=int, nargs="+")
    args = ap.parse_args()
    directory = os.environ.get("CASTOR_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
    data = load(directory)
    accuracies = []
    for seed in args.seeds:
        accuracies.append(train(data, seed, args.epochs, args.batch, args.hidden))
        print(f"seed {seed}: test accuracy {accuracies[-1]:.4f}", flush=True)
    if len(accuracies) > 1:
        print(f"mean {statistics.mean(accuracies):.4f}, sd {statistics.stdev(accuracies):.4f}, "
              f"range {min(accuracies):.4f} .. {max(accuracies):.4f} over {len(accuracies)} seeds")


if __name__ == "__main__":
    main()
