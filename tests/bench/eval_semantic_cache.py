"""Hit rate and false-hit rate of the semantic cache tier on labelled prompt pairs.

    python tests/bench/eval_semantic_cache.py [--pairs FILE.jsonl ...] [--model PATH.gguf] [--show THRESHOLD]

Default pairs: `semantic_pairs.jsonl` (200 pairs; the lexical check was tuned
while looking at its failures) and `semantic_pairs_heldout.jsonl` (100 pairs
written after the check was frozen, used only to choose the threshold).

Each pair is (a, b, same). The cache holds `a`; `b` arrives. A hit on a pair
marked `same` (a paraphrase) is a good hit; a hit on a near miss (a changed
number, a negation, another entity, an antonym, swapped roles) is a false hit
that would serve a wrong answer. Two decisions are scored at each threshold:
`cosine` (similarity alone) and `cache` (similarity and the lexical check the
cache applies, `appliance.cache.semantic.compatible`), which is what the appliance does.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np

from appliance.cache.embedder import DEFAULT_MODEL, LlamaCppEmbedder
from appliance.cache.semantic import compatible

HERE = Path(__file__).resolve().parent
DEFAULT_PAIRS = [HERE.parent / "data" / "semantic_pairs.jsonl", HERE.parent / "data" / "semantic_pairs_heldout.jsonl"]
THRESHOLDS = (0.75, 0.80, 0.85, 0.88, 0.90, 0.92, 0.93, 0.94, 0.95, 0.96, 0.97, 0.98)


def load_pairs(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def score(pairs: list[dict], sims: np.ndarray, guard: list[bool], threshold: float, use_guard: bool) -> tuple[float, float, Counter]:
    good = bad = n_same = n_diff = 0
    false_by_kind: Counter = Counter()
    for pair, sim, ok in zip(pairs, sims, guard):
        hit = sim >= threshold and (ok or not use_guard)
        if pair["same"]:
            n_same += 1
            good += hit
        else:
            n_diff += 1
            bad += hit
            if hit:
                false_by_kind[pair["kind"]] += 1
    return good / max(1, n_same), bad / max(1, n_diff), false_by_kind


def report(title: str, pairs: list[dict], sims: np.ndarray, guard: list[bool], show: float | None) -> None:
    kinds = Counter(p["kind"] for p in pairs)
    print(f"## {title}: {len(pairs)} pairs ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})")
    print()
    print("| threshold | hit rate (cosine) | false-hit rate (cosine) | hit rate (cache) | false-hit rate (cache) | false hits by kind (cache) |")
    print("|---|---|---|---|---|---|")
    for t in THRESHOLDS:
        hr, fr, _ = score(pairs, sims, guard, t, use_guard=False)
        ghr, gfr, kinds_false = score(pairs, sims, guard, t, use_guard=True)
        detail = ", ".join(f"{k} {n}" for k, n in sorted(kinds_false.items())) or "-"
        print(f"| {t:.2f} | {hr:.0%} | {fr:.0%} | {ghr:.0%} | {gfr:.0%} | {detail} |")
    same = sims[[p["same"] for p in pairs]]
    diff = sims[[not p["same"] for p in pairs]]
    blocked = [s for p, s, ok in zip(pairs, sims, guard) if not p["same"] and ok]
    print()
    print(f"similarity of paraphrases: min {same.min():.3f} median {np.median(same):.3f}; of near misses: median "
          f"{np.median(diff):.3f} max {diff.max():.3f} (max among those the lexical check lets through: "
          f"{max(blocked) if blocked else float('nan'):.3f})")
    if show is not None:
        print(f"\nwrong decisions at {show:.2f} (cache):")
        for pair, sim, ok in zip(pairs, sims, guard):
            hit = sim >= show and ok
            if hit != pair["same"]:
                print(f"  {'FALSE HIT' if hit else 'miss     '} {sim:.3f} check={'ok' if ok else 'no'} [{pair['kind']}] {pair['a']!r} / {pair['b']!r}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=Path, nargs="+", default=DEFAULT_PAIRS)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--show", type=float, default=None, help="list the pairs decided wrongly at this threshold")
    args = parser.parse_args()

    embedder = LlamaCppEmbedder(args.model)
    everything: tuple[list, list, list] = ([], [], [])
    for path in args.pairs:
        pairs = load_pairs(path)
        started = time.perf_counter()
        a = embedder.embed([p["a"] for p in pairs])
        b = embedder.embed([p["b"] for p in pairs])
        elapsed = time.perf_counter() - started
        sims = (a * b).sum(axis=1)
        guard = [compatible(p["b"], p["a"]) for p in pairs]
        print(f"model {embedder.name}: {2 * len(pairs)} embeddings in {elapsed:.2f} s ({elapsed / (2 * len(pairs)) * 1000:.1f} ms each)")
        report(path.name, pairs, sims, guard, args.show)
        everything[0].extend(pairs)
        everything[1].extend(sims.tolist())
        everything[2].extend(guard)
    if len(args.pairs) > 1:
        report("all pairs", everything[0], np.asarray(everything[1]), everything[2], None)


if __name__ == "__main__":
    main()
