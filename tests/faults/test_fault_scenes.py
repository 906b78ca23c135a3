"""The batched cut detector takes a 1-frame (or empty) video: it used to raise AttributeError in `push_all`
(cv2.absdiff of two empty arrays returns None) and take the whole Beam job down."""

import numpy as np
import pytest

from beam_jobs.scenes import ContentCuts


@pytest.mark.parametrize("n", [0, 1, 2])
def test_push_all_on_tiny_inputs_matches_push(n):
    rng = np.random.default_rng(n)
    frames = rng.integers(0, 255, (n, 16, 16, 3), dtype=np.uint8)
    batched, single = ContentCuts(8.0, 15.0, 4, min_changed=0.5), ContentCuts(8.0, 15.0, 4, min_changed=0.5)
    batched.push_all(frames)
    for i, f in enumerate(frames):
        single.push(i, f)
    assert batched.finish() == single.finish() == []
