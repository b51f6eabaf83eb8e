"""tritonclient helpers shared by the demo, the load generators and the tests."""

from __future__ import annotations

from typing import Dict, List

import numpy as np


def infer_inputs(module, feed: Dict[str, np.ndarray]) -> List:
    """`InferInput`s of tritonclient.http or tritonclient.grpc (`module`) holding `feed`."""
    from tritonclient.utils import np_to_triton_dtype

    tensors = []
    for name, array in feed.items():
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors
