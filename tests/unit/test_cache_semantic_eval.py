"""The semantic cache's published accuracy, measured with the shipped embedding model (all-MiniLM-L6-v2 GGUF,
llama.cpp in-process) at the default threshold on the labelled pairs of ``tests/data`` (see tests/semantic_eval.py).

The numbers are the README's ("Response cache"): a change that serves more near misses or fewer
paraphrases fails here, and one that does better should raise them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.cache.embedder import LlamaCppEmbedder
from appliance.settings import Settings
from tests.semantic_eval import FRESH, HELDOUT, TUNING, embed, load_pairs, score

THRESHOLD = Settings.model_fields["semantic_cache_threshold"].default

#: set: (paraphrases, near misses, good hits at least, false hits at most) at the default threshold
PUBLISHED = {
    TUNING: (100, 100, 77, 0),
    HELDOUT: (50, 50, 28, 0),
    FRESH: (20, 41, 11, 4),  # the four: taller/shorter, easier/harder, tomorrow/today, sunset/sunrise
}


@pytest.fixture(scope="module")
def embedder():
    e = LlamaCppEmbedder()
    yield e
    e.close()


@pytest.mark.parametrize("path", list(PUBLISHED), ids=lambda p: p.stem)
def test_hit_rate_and_false_hits_at_the_default_threshold(embedder, path: Path):
    paraphrases, near_misses, good_hits, false_hits = PUBLISHED[path]
    embedded = embed(embedder, load_pairs(path))
    s = score(embedded.pairs, embedded.cache_hits(THRESHOLD))
    assert (s.paraphrases, s.near_misses) == (paraphrases, near_misses)
    assert s.good_hits >= good_hits, f"hit rate {s.hit_rate:.0%} below the published {good_hits / paraphrases:.0%}"
    assert s.false_hits <= false_hits, f"false hits {dict(s.false_by_kind)}: more than the published {false_hits}"
