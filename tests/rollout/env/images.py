"""Pixels of screenshots, for the tests that check what an image shows."""

import io

import numpy as np
from PIL import Image

MARK_RGB = (0xE0, 0x11, 0x5F)  # the colour OVERLAY_JS draws the marks in


def pixels(image: bytes, rgb, tolerance: int = 8) -> int:
    """How many pixels of ``image`` are ``rgb``, each channel within ``tolerance``."""
    px = np.asarray(Image.open(io.BytesIO(image)).convert("RGB"), dtype=np.int16)
    return int((np.abs(px - np.array(rgb)) <= tolerance).all(axis=-1).sum())
