"""In-memory data as numpy batches, where TensorFlow is not installed (Keras's
JAX backend on a JAX-only install): the examples, order and padding of the
tf.data pipelines of arrays.py and sources.py, behind the methods of
tf.data.Dataset the tool calls (take, concatenate, iteration)."""

import numpy as np


class Batches:
    """Batches made on demand, in order: `parts` is a list of (count,
    make), make(i) giving batch i of its part."""

    def __init__(self, parts):
        self.parts = parts

    @classmethod
    def of(cls, count, make):
        return cls([(count, make)])

    def take(self, count):
        parts = []
        for size, make in self.parts:
            if count <= 0:
                break
            parts.append((min(size, count), make))
            count -= size
        return Batches(parts)

    def concatenate(self, other):
        return Batches(self.parts + other.parts)

    def __iter__(self):
        for count, make in self.parts:
            for index in range(count):
                yield make(index)


def padded_batches(images, labels, batch_size, num_batches, image_size, preprocess=None):
    """`num_batches` batches of (images, labels, weights): the examples with
    weight 1, then blank ones with weight 0 (sources.padded_batches)."""

    def make(index):
        real = slice(index * batch_size, (index + 1) * batch_size)
        x, y = images[real], labels[real]
        if not len(y):
            x = np.zeros((0, image_size, image_size, 3), np.float32)
        elif preprocess is not None:
            x = preprocess(x)
        blank = batch_size - len(y)
        weights = np.concatenate([np.ones(len(y)), np.zeros(blank)]).astype(np.float32)
        x = np.concatenate([x, np.zeros((blank, image_size, image_size, 3), np.float32)])
        y = np.concatenate([y, np.zeros(blank, np.int32)])
        return x.astype(np.float32), y.astype(np.int32), weights

    return Batches.of(num_batches, make)
