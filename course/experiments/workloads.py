"""Synthetic request-length workloads whose means match the vLLM paper's datasets.

Kwon et al. (SOSP 2023, section 6.1) report mean input / output lengths of 161.31 / 337.99
tokens for ShareGPT and 19.31 / 58.45 for Alpaca, and show both as long-tailed histograms
(their Fig. 11). The traces themselves are not redistributed here, so lengths are drawn from
**log-normal** distributions with exactly those means and an assumed spread ``sigma`` (the
shape is this course's assumption; only the means come from the paper):

    length ~ LogNormal(mu, sigma),  mu = ln(mean) - sigma**2 / 2   (so E[length] = mean)

rounded to whole tokens, at least 1, and redrawn when a request would exceed
``max_model_len`` (so the cap trims the tail without piling requests up at the cap).
Every draw is seeded: the same seed gives the same requests.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class LengthMix:
    """A workload: log-normal input and output lengths with the given means."""

    name: str
    mean_input: float
    mean_output: float
    sigma_input: float
    sigma_output: float
    source: str


SHAREGPT = LengthMix("ShareGPT-like", 161.31, 337.99, 0.6, 0.6,
                     "means: Kwon et al., SOSP 2023, section 6.1; log-normal shape assumed")
ALPACA = LengthMix("Alpaca-like", 19.31, 58.45, 0.6, 0.8,
                   "means: Kwon et al., SOSP 2023, section 6.1; log-normal shape assumed")
MIXES = {mix.name: mix for mix in (SHAREGPT, ALPACA)}


@dataclass(frozen=True)
class Request:
    """One request: its prompt length and how many tokens it will generate."""

    prompt_len: int
    output_len: int

    @property
    def final_len(self) -> int:
        return self.prompt_len + self.output_len


def _lognormal(rng: random.Random, mean: float, sigma: float) -> int:
    mu = math.log(mean) - sigma**2 / 2
    return max(1, round(rng.lognormvariate(mu, sigma)))


def sample_requests(mix: LengthMix, count: int, seed: int = 0,
                    max_model_len: int = 2048) -> list[Request]:
    """``count`` requests drawn from ``mix``, each at most ``max_model_len`` tokens in all."""
    rng = random.Random(seed)
    requests = []
    while len(requests) < count:
        request = Request(_lognormal(rng, mix.mean_input, mix.sigma_input),
                          _lognormal(rng, mix.mean_output, mix.sigma_output))
        if request.final_len <= max_model_len:
            requests.append(request)
    return requests
