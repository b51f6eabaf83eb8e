"""Pre-process step of the example image pipeline: image file bytes -> the CNN's input.

Images arrive as binary PPM files (P6: a short text header, then RGB bytes), any size;
each is resized to 32x32 (nearest pixel) and scaled to zero mean, as the CNN was built.
"""

import numpy as np

SIZE = 32


def read_ppm(data: bytes) -> np.ndarray:
    """A binary PPM file's pixels as [height, width, 3] uint8."""
    tokens, at = [], 0
    while len(tokens) < 4:
        while at < len(data) and data[at:at + 1].isspace():
            at += 1
        start = at
        while at < len(data) and not data[at:at + 1].isspace():
            at += 1
        tokens.append(data[start:at])
    if tokens[0] != b"P6" or not all(t.isdigit() for t in tokens[1:]) or int(tokens[3]) != 255:
        raise ValueError(f"not an 8-bit binary PPM image (header {b' '.join(tokens)[:40]!r})")
    width, height = int(tokens[1]), int(tokens[2])
    if len(data) < at + 1 + width * height * 3:
        raise ValueError(f"the PPM image holds fewer than its {width}x{height} pixels")
    pixels = np.frombuffer(data, dtype=np.uint8, count=width * height * 3, offset=at + 1)
    return pixels.reshape(height, width, 3)


def pixels(image: bytes) -> np.ndarray:
    """One image file -> [3, SIZE, SIZE] float32."""
    rgb = read_ppm(image)
    rows = np.arange(SIZE) * rgb.shape[0] // SIZE
    cols = np.arange(SIZE) * rgb.shape[1] // SIZE
    small = rgb[rows][:, cols].astype(np.float32)
    return ((small / 255.0 - 0.5) / 0.25).transpose(2, 0, 1)


def decode(images: np.ndarray) -> np.ndarray:
    """[batch, 1] image files (bytes) -> [batch, 3, SIZE, SIZE] float32."""
    return np.stack([pixels(image) for image in images.reshape(-1)])


class TritonPythonModel:
    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            try:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PIXELS", decode(images))]))
            except ValueError as exc:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)))
        return responses
