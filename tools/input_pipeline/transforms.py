"""Per-image preprocessing: the crop windows, resizing, flipping and the
channel normalisation (pure functions of the image and a seed).

Training: a random crop covering 8%-100% of the image area with aspect ratio
in [3/4, 4/3] (Szegedy et al. 2015), decoded together with the crop
(`decode_and_crop_jpeg`), resized to image_size, randomly flipped.
Evaluation: the central square of side 0.875 * min(height, width) (a 224
crop of a 256 image), resized to image_size. Both normalise each channel
with the ImageNet mean and standard deviation (of 0..255 values):
x' = (x - mean) / stddev.
"""

import numpy as np

from keras_lars.tools.tensorflow_or_none import tf

MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STDDEV_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)
AREA_RANGE = (0.08, 1.0)
ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)
EVAL_CROP_FRACTION = 224 / 256


def sample_crop_window(image_shape, seed):
    """Random crop (offset_y, offset_x, height, width) of an image of shape
    (height, width, channels): area fraction in AREA_RANGE, aspect ratio
    width/height in ASPECT_RATIO_RANGE, up to integer rounding; the whole
    image if 10 attempts find no such crop. `seed`: int tensor of shape [2]."""
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        image_size=image_shape,
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=seed,
        min_object_covered=0.0,
        aspect_ratio_range=ASPECT_RATIO_RANGE,
        area_range=AREA_RANGE,
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    return tf.stack([begin[0], begin[1], size[0], size[1]])


def central_crop_window(image_shape):
    """The evaluation crop (offset_y, offset_x, side, side): the central
    square of side floor(EVAL_CROP_FRACTION * min(height, width))."""
    height, width = image_shape[0], image_shape[1]
    side = tf.cast(EVAL_CROP_FRACTION * tf.cast(tf.minimum(height, width), tf.float64), tf.int32)
    return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])


def normalize(images):
    """(x - mean) / stddev per channel, x in 0..255: float32, a numpy array
    for a numpy array (host.py's batches), else a tensor."""
    if isinstance(images, np.ndarray):
        return (images.astype(np.float32) - np.float32(MEAN_RGB)) / np.float32(STDDEV_RGB)
    return (tf.cast(images, tf.float32) - MEAN_RGB) / STDDEV_RGB


def preprocess_for_train(jpeg, image_size, seed):
    """JPEG bytes -> normalised float32 (image_size, image_size, 3):
    random-area crop, resize, random left-right flip. `seed`: shape [2]."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
    window = sample_crop_window(tf.image.extract_jpeg_shape(jpeg), crop_seed)
    image = tf.image.decode_and_crop_jpeg(jpeg, window, channels=3)
    image = tf.image.resize(image, [image_size, image_size])
    image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    return normalize(image)


def preprocess_for_eval(jpeg, image_size):
    """JPEG bytes -> normalised float32 (image_size, image_size, 3): the
    central 224/256 crop, resized."""
    window = central_crop_window(tf.image.extract_jpeg_shape(jpeg))
    image = tf.image.decode_and_crop_jpeg(jpeg, window, channels=3)
    return normalize(tf.image.resize(image, [image_size, image_size]))
