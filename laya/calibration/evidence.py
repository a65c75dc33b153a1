"""What a model saw for one question before any temperature: enough to decode it at any temperature.

Both engines produce it: an encoder model has one readout (its option logits, with the act head's
probability beside them); the decide engine has one or two (a yes/no question is read in both
orders and averaged), each the log-probabilities of the options' first tokens. Fitting a
temperature re-decodes the same evidence many times without running the model again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Evidence:
    qtype: str
    n_options: int
    # (option indices, logits over those options) per readout
    readouts: tuple[tuple[tuple[int, ...], np.ndarray], ...]
    act_probability: float | None = None
    # each readout is a no/yes row about the one level its indices name (decider's isolated score):
    # a level's probability is its row's P(yes), normalised over the levels
    isolated: bool = False

    @classmethod
    def single(cls, qtype: str, logits: np.ndarray, act_probability: float | None = None) -> Evidence:
        z = np.asarray(logits, dtype=np.float64)
        return cls(qtype, len(z), ((tuple(range(len(z))), z),), act_probability)

    def probabilities(self, temperature: float) -> np.ndarray:
        """softmax(logits / T) of each readout, placed on the options it reads and averaged."""
        from laya.decoding.decode import probabilities

        if self.isolated:
            p = np.zeros(self.n_options)
            for (level,), z in self.readouts:
                p[level] = probabilities(z, temperature)[1]
            total = p.sum()
            return p / total if total > 0 else np.full(self.n_options, 1.0 / self.n_options)
        if len(self.readouts) == 1 and len(self.readouts[0][0]) == self.n_options:
            keys, z = self.readouts[0]
            p = np.empty(self.n_options)
            p[list(keys)] = probabilities(z, temperature)
            return p
        p = np.zeros(self.n_options)
        for keys, z in self.readouts:
            p[list(keys)] += probabilities(z, temperature)
        return p / len(self.readouts)
