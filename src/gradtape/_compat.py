"""What differs between the NumPy versions gradtape supports, in one place.

gradtape follows the NumPy it runs with: where an older NumPy computes a result differently
(or lacks a name), the difference is stated here once, as a constant or a shim, and the rules
read it from here instead of testing versions themselves.
"""

from __future__ import annotations

import numpy as np

NUMPY_VERSION = np.lib.NumpyVersion(np.__version__)

# NumPy before 2.4 casts a Python-number `q` of quantile/percentile to the dtype of a floating
# input before computing the index (float32 input: the index is computed in float32); 2.4
# computes it at full precision (numpy/numpy#29105).
QUANTILE_WEAK_Q_IN_INPUT_DTYPE = NUMPY_VERSION < "2.4.0"
