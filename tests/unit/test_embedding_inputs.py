"""The per-key cap on embedding inputs in flight: holds, refusals, and holds given back."""

from __future__ import annotations

import pytest

from appliance.errors import RateLimited
from appliance.serving.embedding_inputs import EmbeddingInputs


def test_embedding_inputs_are_held_per_key_until_answered():
    cap = EmbeddingInputs(8)
    with cap.hold("key:1", 5):
        assert cap.in_flight("key:1") == 5
        with pytest.raises(RateLimited) as info, cap.hold("key:1", 4):
            pass
        assert info.value.code == "embedding_inputs_in_flight" and info.value.headers == {"Retry-After": "1"}
        assert "has 5 embedding inputs in flight; 4 more would pass its cap of 8" in info.value.message
        with cap.hold("key:2", 8):  # another key has its own room
            assert cap.in_flight("key:2") == 8
        with cap.hold("key:1", 3):
            assert cap.in_flight("key:1") == 8
    assert cap.in_flight("key:1") == 0 and cap.in_flight("key:2") == 0
    with pytest.raises(RateLimited) as info, cap.hold("key:1", 9):
        pass
    assert info.value.code == "embedding_inputs_over_cap" and "requests of at most 8" in info.value.message
    with pytest.raises(ValueError), cap.hold("key:1", 8):
        raise ValueError("the request failed")
    assert cap.in_flight("key:1") == 0  # a failed request gives its inputs back
