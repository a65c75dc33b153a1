"""The decide engine's kept state on SmolLM2: what each extra question over one state costs.

    .venv/bin/python benchmarks/decide_prefix.py [--gguf PATH] [--repeats 3]

One question over a ~300-token state, then 4 and 16 questions over the same state, with the prefix
cache on and off, same run. Reports medians over repeats: the first question's time, the mean cost
of each extra question, and their ratio (the target: an extra question costs at most 20% of the first).
"""

from __future__ import annotations

import argparse
import statistics
import time

from laya.decide.llama import LlamaBackend
from laya.decide.policy import Decider, PrefixCache
from laya.decide.prompts import prefix_for
from laya.server.serve import smollm2_gguf

SENTENCES = [
    "Customer message thread.", "Hi, I was charged twice for my subscription this month, once on the 3rd and",
    "again on the 5th, and I only have one account. I contacted you last week and got no answer.",
    "My plan is the team plan with five seats, billed monthly. I also noticed the invoice lists a seat",
    "I removed in October. Before that, everything was fine for two years. I would like the extra charge",
    "refunded to the same card, and the invoice corrected. If this cannot be fixed this week I will cancel",
    "and move to another provider. Also, the export feature has been slow since the last update, taking",
    "minutes for a small report, and the mobile app logs me out every day. Please tell me who is handling",
    "this and when I can expect an answer. I have attached the two receipts and a screenshot of the",
    "invoice. Thank you, and sorry for the long message, but this is the third time I write about it.",
]
STATE = " ".join(SENTENCES + SENTENCES[:4])  # about 300 tokens with the prompt's framing


def questions(n: int) -> list[tuple[str, list[str]]]:
    topics = ["billing", "refunds", "export speed", "mobile logins", "cancellation risk", "invoice errors",
              "seat changes", "response time"]
    out = []
    for i in range(n):
        topic = topics[i % len(topics)]
        suffix = (f"Question {i}: how much does the message say about {topic}?\nOptions:\n- nothing\n- little\n"
                  f"- much\nAnswer with the name of the best option only.")
        out.append((suffix, ["nothing", "little", "much"]))
    return out


def run(decider: Decider, n: int) -> tuple[float, list[float], int]:
    decider.cache.drop()
    prefix = prefix_for(STATE)
    times, n_tokens = [], 0
    for suffix, labels in questions(n):
        t0 = time.perf_counter()
        _, report = decider.decide(prefix, suffix, labels)
        times.append(time.perf_counter() - t0)
        n_tokens = report.n_tokens
    return times[0], times[1:], n_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    path = args.gguf or smollm2_gguf()
    on = Decider(LlamaBackend(path, n_ctx=2048, n_threads=args.threads), PrefixCache(policy="on"))
    off = Decider(LlamaBackend(path, n_ctx=2048, n_threads=args.threads), PrefixCache(policy="off"))
    state_tokens = len(on.backend.tokenize(prefix_for(STATE)))
    run(on, 2)
    run(off, 2)  # warm-up
    print(f"model {path.name if hasattr(path, 'name') else path}, state {state_tokens} tokens, "
          f"threads {args.threads}, medians of {args.repeats}")
    for n in (1, 4, 16):
        for name, decider in (("cache on ", on), ("cache off", off)):
            firsts, extras, total = [], [], []
            for _ in range(args.repeats):
                first, rest, tokens = run(decider, n)
                firsts.append(first)
                if rest:
                    extras.append(statistics.mean(rest))
                total.append(first + sum(rest))
            first = statistics.median(firsts)
            line = f"{n:2d} questions, {name}: first {first * 1000:7.1f} ms"
            if extras:
                extra = statistics.median(extras)
                line += f", each extra {extra * 1000:6.1f} ms = {extra / first:5.1%} of the first"
            line += f", total {statistics.median(total) * 1000:7.1f} ms ({tokens} prompt tokens per question)"
            print(line)
        if n > 1:
            kept = on.cache.kept
            print(f"   kept state {kept.nbytes / 1024 / 1024:.1f} MiB for {len(kept.tokens)} tokens")


if __name__ == "__main__":
    main()
