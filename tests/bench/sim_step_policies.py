"""The step planner against the pacing it replaced, on simulated time: same arrivals, same step costs, no box noise.

Each step costs ``a + b·rows + c·prompt_tokens`` seconds (defaults from
``bench_decode_shapes.py`` on the two-core test box with the default model: 8
generating rows about 54 ms, prompt reading about 450 tokens/s). Arrivals and
lengths come from ``bench_mixed_traffic.workload`` (prompt tokens taken as 1.3 per
word), 8 slots, first come first served into free slots. Two policies:

- ``paced``: the old batcher: a step carries ``rate x 0.1 s`` tokens while anyone
  else waits (``rate x 0.25 s`` otherwise, at least 16 prompt tokens), the rate
  learned by ``StepPacer``, prompt tokens shared max-min fairly;
- ``planner``: the real ``StepPlanner`` (latency targets, learned step cost,
  shortest-remaining order), driven on the simulated clock.

Prints TTFT p50/p95, TPOT p95 and goodput (TTFT <= 2 s, TPOT <= 150 ms) at 50/70/90%
of the capacity the planner reaches with every request arriving at once.

    python tests/bench/sim_step_policies.py [--requests 200] [--a 0.012 --b 0.0055 --c 0.0022]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from appliance.drivers.llamacpp.latency import LatencyTargets  # noqa: E402
from appliance.drivers.llamacpp.scheduling import StepPacer  # noqa: E402
from appliance.drivers.llamacpp.sequence import Sequence, Slot  # noqa: E402
from appliance.drivers.llamacpp.step_planner import MIN_PREFILL_TOKENS, StepPlanner  # noqa: E402
from tests.bench.bench_mixed_traffic import pct, workload  # noqa: E402

N_BATCH, SLOTS = 256, 8


def fair_shares(wants: list[int], budget: int) -> list[int]:
    """The old max-min fair split (as the batcher had it)."""
    shares, left = [0] * len(wants), len(wants)
    for i in sorted(range(len(wants)), key=lambda i: wants[i]):
        fair = budget // left + (1 if budget % left else 0)
        shares[i] = min(wants[i], fair, budget)
        budget -= shares[i]
        left -= 1
    return shares


def simulate(policy: str, schedule: list[tuple[float, int, int]], cost: tuple[float, float, float]) -> list[Sequence]:
    a, b, c = cost
    planner, pacer = StepPlanner(LatencyTargets(), N_BATCH), StepPacer(MIN_PREFILL_TOKENS)
    pending = [Sequence(list(range(p)), m, None, []) for _, p, m in schedule]
    for seq, (t, _, _) in zip(pending, schedule, strict=True):
        seq.t_submit = t
    done: list[Sequence] = []
    slots = [Slot(i) for i in range(SLOTS)]
    now, queue = 0.0, list(pending)
    while len(done) < len(pending):
        for s in slots:
            if s.seq is None and queue and queue[0].t_submit <= now:
                s.seq, s.tokens = queue.pop(0), []
        active = [s for s in slots if s.seq is not None]
        if not active:
            now = queue[0].t_submit
            continue
        gen = [s for s in active if s.seq.n_gen > 0]
        reading = [s for s in active if s.seq.n_gen == 0]
        rows = len(gen)
        if policy == "planner":
            budget = planner.prompt_budget(planner.step_seconds(active, now), rows + 1, N_BATCH - rows)
            plan = planner.shares(reading, budget, now)
        else:
            waiting = rows or len(reading) > 1 or (queue and queue[0].t_submit <= now)
            paced = pacer.tokens(0.1 if waiting else 0.25, N_BATCH) - rows
            budget = min(N_BATCH - rows, max(paced, MIN_PREFILL_TOKENS))
            wants = [len(s.seq.prompt) - len(s.tokens) for s in reading]
            plan = list(zip(reading, fair_shares(wants, budget), strict=True))
        read = sum(n for _, n in plan)
        finals = sum(1 for s, n in plan if len(s.tokens) + n == len(s.seq.prompt))
        dt = a + b * (rows + finals) + c * read
        now += dt
        planner.observe(rows + finals, read, dt)
        pacer.observe(rows + read, dt)
        for s, n in plan:
            s.tokens.extend(s.seq.prompt[len(s.tokens) : len(s.tokens) + n])
            if len(s.tokens) == len(s.seq.prompt):
                s.seq.n_gen, s.seq.t_first = 1, now
        for s in gen:
            s.seq.n_gen += 1
        for s in active:
            if s.seq.n_gen >= s.seq.max_new:
                s.seq.text = now  # the last token's time (the text stream is not used here)
                done.append(s.seq)
                s.seq = None
    return done


def report(seqs: list[Sequence], wall: float) -> dict[str, float]:
    ttft = [s.t_first - s.t_submit for s in seqs]
    tpot = [(s.text - s.t_first) / max(1, s.max_new - 1) for s in seqs]
    good = sum(1 for x, y in zip(ttft, tpot, strict=True) if x <= 2.0 and y <= 0.150)
    return {
        "tok_s": sum(s.max_new for s in seqs) / wall,
        "ttft_p50": pct(ttft, 50),
        "ttft_p95": pct(ttft, 95),
        "tpot_p95": pct(tpot, 95),
        "goodput": good / len(seqs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--a", type=float, default=0.012)
    ap.add_argument("--b", type=float, default=0.0055)
    ap.add_argument("--c", type=float, default=0.0022)
    args = ap.parse_args()
    cost = (args.a, args.b, args.c)

    def shaped(seed: int, rate: float) -> list[tuple[float, int, int]]:
        return [(t, int(len(p.split()) * 1.3), m) for t, p, m in workload(seed, args.requests, rate)]

    burst = [(0.0, p, m) for _, p, m in shaped(7, 1.0)]
    finished = simulate("planner", burst, cost)
    capacity = len(finished) / max(s.text for s in finished)
    print(f"capacity (all arriving at once, planner): {capacity:.3f} requests/s; step cost a={args.a} b={args.b} c={args.c}\n")
    print("| load | policy | tok/s | TTFT p50 | TTFT p95 | TPOT p95 | goodput |")
    print("|---|---|---|---|---|---|---|")
    for load in (0.5, 0.7, 0.9):
        schedule = shaped(int(load * 100), load * capacity)
        for policy in ("paced", "planner"):
            seqs = simulate(policy, schedule, cost)
            r = report(seqs, max(s.text for s in seqs))
            print(
                f"| {load:.0%} | {policy} | {r['tok_s']:.1f} | {r['ttft_p50']:.2f} s | {r['ttft_p95']:.2f} s "
                f"| {r['tpot_p95'] * 1000:.0f} ms | {r['goodput']:.2f} |"
            )


if __name__ == "__main__":
    main()
