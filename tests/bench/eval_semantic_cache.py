"""Hit rate and false-hit rate of the semantic cache tier on labelled prompt pairs, at many thresholds.

    python tests/bench/eval_semantic_cache.py [--pairs FILE.jsonl ...] [--model PATH.gguf] [--show THRESHOLD]

Default pairs: the three sets in tests/data (see tests/semantic_eval.py for what each is and how
it was written). The default threshold's numbers are enforced by
tests/unit/test_cache_semantic_eval.py; this script prints the tables around them. Two decisions
are scored at each threshold: `cosine` (similarity alone) and `cache` (the cache's own search:
similarity and the lexical check, `appliance.cache.lexical.compatible`), which is what the
appliance does.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from appliance.cache.embedder import DEFAULT_MODEL, LlamaCppEmbedder  # noqa: E402
from appliance.cache.lexical import compatible  # noqa: E402
from tests.semantic_eval import ALL_SETS, Embedded, embed, load_pairs, score  # noqa: E402

THRESHOLDS = (0.75, 0.80, 0.85, 0.88, 0.90, 0.92, 0.93, 0.94, 0.95, 0.96, 0.97, 0.98)


def report(title: str, embedded: Embedded, show: float | None) -> None:
    pairs, sims = embedded.pairs, embedded.similarities
    kinds = Counter(p.kind for p in pairs)
    print(f"## {title}: {len(pairs)} pairs ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})")
    print()
    print(
        "| threshold | hit rate (cosine) | false-hit rate (cosine) | hit rate (cache) | false-hit rate (cache) | false hits by "
        "kind (cache) |"
    )
    print("|---|---|---|---|---|---|")
    for t in THRESHOLDS:
        cosine, cache = score(pairs, embedded.cosine_hits(t)), score(pairs, embedded.cache_hits(t))
        detail = ", ".join(f"{k} {n}" for k, n in sorted(cache.false_by_kind.items())) or "-"
        print(
            f"| {t:.2f} | {cosine.hit_rate:.0%} | {cosine.false_hit_rate:.0%} | {cache.hit_rate:.0%} | "
            f"{cache.false_hit_rate:.0%} | {detail} |"
        )
    lexical = [compatible(p.b, p.a) for p in pairs]
    same = sims[[p.same for p in pairs]]
    diff = sims[[not p.same for p in pairs]]
    let_through = [s for p, s, ok in zip(pairs, sims, lexical, strict=True) if not p.same and ok]
    print()
    print(
        f"similarity of paraphrases: min {same.min():.3f} median {np.median(same):.3f}; of near misses: median "
        f"{np.median(diff):.3f} max {diff.max():.3f} (max among those the lexical check lets through: "
        f"{max(let_through) if let_through else float('nan'):.3f})"
    )
    if show is not None:
        print(f"\nwrong decisions at {show:.2f} (cache):")
        for pair, sim, ok, hit in zip(pairs, sims, lexical, embedded.cache_hits(show), strict=True):
            if hit != pair.same:
                print(
                    f"  {'FALSE HIT' if hit else 'miss     '} {sim:.3f} check={'ok' if ok else 'no'} [{pair.kind}] {pair.a!r} / "
                    f"{pair.b!r}"
                )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=Path, nargs="+", default=list(ALL_SETS))
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--show", type=float, default=None, help="list the pairs decided wrongly at this threshold")
    args = parser.parse_args()

    embedder = LlamaCppEmbedder(args.model)
    sets = []
    for path in args.pairs:
        pairs = load_pairs(path)
        started = time.perf_counter()
        embedded = embed(embedder, pairs)
        elapsed = time.perf_counter() - started
        print(
            f"model {embedder.name}: {2 * len(pairs)} embeddings in {elapsed:.2f} s ({elapsed / (2 * len(pairs)) * 1000:.1f} ms "
            "each)"
        )
        report(path.name, embedded, args.show)
        sets.append(embedded)
    if len(sets) > 1:
        report("all pairs", sum(sets[1:], sets[0]), None)


if __name__ == "__main__":
    main()
