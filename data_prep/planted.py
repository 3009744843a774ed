"""The learnable structure planted in the synthetic release, and the best nRMSE it allows.

Challenge 1 (response time, RT, seconds). Every contrastChangeDetection trial with a press gets
two components whose timing follows the trial's RT:

* a centro-parietal positivity (CPP, the evidence-accumulation signal; Pz, E62): a linear ramp
  from ``cpp_start`` s after the target up to a peak at ``RT + N(0, cpp_jitter)``, then an
  exponential decay (``cpp_decay`` s); ``cpp_uv`` µV × U(0.7, 1.3) per trial;
* a motor bump (C4/E104 for a left press, C3/E36 for a right one, a third of it on the other side)
  peaking ``RT - motor_lead + N(0, motor_jitter)`` s after the target, ``motor_uv`` µV.

* motor beta (20 Hz, both motor cortices, ``beta_uv`` µV): suppressed to ``beta_erd`` from 0.4 s
  before to 0.2 s after the motor latency, rebound to ``beta_rebound`` from 0.4 to 1.0 s after it
  (same latent as the motor bump, so no extra information: a band-power code for RT).

All sit inside the challenge window (0.5–2.5 s after the target) for typical RTs. RT itself is
lognormal: subject median ``rt_median`` × exp(N(0, rt_subject_sd)), trial spread
``rt_trial_sd`` (log units), clipped to [rt_min, rt_max].

Challenge 2 (externalizing). Occipital alpha amplitude (µV) of every recording of a subject is
``alpha_uv × exp(alpha_beta × externalizing + N(0, alpha_subject_sd))`` (× ``eyes_closed_gain``
with eyes closed). The subject noise term makes the target only weakly recoverable.

:data:`PLANTED` is what the default releases plant. :data:`PLANTED_FOLDS` (the subject-fold
release, ``source.SYNTHETIC["folds"]``) plants the same Challenge 1 structure and a stronger
Challenge 2 effect, ``alpha_beta`` 0.5 and ``alpha_subject_sd`` 0.2, so that externalizing can
be learnt from 2-s resting crops and measured over folds of a few dozen test subjects: with the
defaults the subject noise hides most of the effect (even the oracle explains less than half of
the target's variance) and a per-crop model has little to find (``ceilings(p)`` for both).

The oracles (:func:`oracle_c1`, :func:`oracle_c2`) are the planted signal's best prediction for
given trials or subjects, from the latents the release records
(``synthetic.latents(root)``): score them on a fold's test subjects for that fold's reference.
The ceilings (:func:`ceilings`) are the Bayes-optimal nRMSE for an oracle that reads the planted
latent times *exactly* (C1: posterior mean of RT given both bump latencies, Monte Carlo over the
generative model; C2: the closed form for a Gaussian target measured with Gaussian noise). The EEG
background (1/f noise, alpha, 24-bit quantisation, the window cutting early bumps) only makes
things worse, so no model can beat these numbers on this data; a model that gets near them has
learnt everything that was planted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Planted:
    rt_median: float = 0.9
    rt_subject_sd: float = 0.15
    rt_trial_sd: float = 0.40
    rt_min: float = 0.30
    rt_max: float = 2.39
    cpp_start: float = 0.20
    cpp_jitter: float = 0.10
    cpp_decay: float = 0.30
    cpp_uv: float = 12.0
    motor_lead: float = 0.05
    motor_jitter: float = 0.12
    motor_width: float = 0.10
    motor_uv: float = -12.0
    visual_uv: float = 4.0
    beta_uv: float = 12.0
    beta_erd: float = 0.3
    beta_rebound: float = 4.0
    alpha_uv: float = 6.0
    alpha_beta: float = 0.25
    alpha_subject_sd: float = 0.30
    eyes_closed_gain: float = 2.5
    externalizing_mean: float = -0.1
    externalizing_sd: float = 1.0

    def to_dict(self) -> dict:
        return asdict(self)


PLANTED = Planted()
PLANTED_FOLDS = Planted(alpha_beta=0.5, alpha_subject_sd=0.2)


def sample_rt(rng: np.random.Generator, subject_median: float, n: int,
              p: Planted = PLANTED) -> np.ndarray:
    """Trial RTs (s) for one subject."""
    rt = subject_median * np.exp(rng.normal(0, p.rt_trial_sd, n))
    return np.clip(rt, p.rt_min, p.rt_max)


def _rt_prior(p: Planted, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(grid, prior weights) of the population's RT distribution (a large sample, binned)."""
    grid = np.linspace(p.rt_min, p.rt_max, 400)
    ref = np.clip(p.rt_median * np.exp(rng.normal(0, p.rt_subject_sd, 400000)
                                       + rng.normal(0, p.rt_trial_sd, 400000)),
                  p.rt_min, p.rt_max)
    edges = np.concatenate([[grid[0] - 1e-9], (grid[1:] + grid[:-1]) / 2, [grid[-1] + 1e-9]])
    return grid, np.histogram(ref, edges)[0] + 1e-12


def oracle_c1(cpp_peak, motor_latency, p: Planted = PLANTED, seed: int = 0) -> np.ndarray:
    """Posterior-mean RT (s) of each trial given its exact CPP peak and motor-bump latencies
    (s after the target), under the population prior (the subject's own median unknown)."""
    lp = np.asarray(cpp_peak, float).reshape(-1)
    lm = np.asarray(motor_latency, float).reshape(-1)
    grid, prior = _rt_prior(p, np.random.default_rng([seed, 1]))
    est = np.empty(len(lp))
    for s in range(0, len(lp), 2000):
        sl = slice(s, s + 2000)
        ll = (-0.5 * ((lm[sl, None] - (grid - p.motor_lead)) / p.motor_jitter) ** 2
              - 0.5 * ((lp[sl, None] - grid) / p.cpp_jitter) ** 2)
        w = prior * np.exp(ll - ll.max(axis=1, keepdims=True))
        est[sl] = (w * grid).sum(axis=1) / w.sum(axis=1)
    return est


def oracle_c2(log_alpha, p: Planted = PLANTED) -> np.ndarray:
    """Posterior-mean externalizing of each subject given its exact log alpha gain
    (``log(alpha amplitude / alpha_uv)`` = ``alpha_beta`` × externalizing + subject noise)."""
    m = np.asarray(log_alpha, float)
    b, s, mu, sd = p.alpha_beta, p.alpha_subject_sd, p.externalizing_mean, p.externalizing_sd
    return mu + b * sd**2 / (b**2 * sd**2 + s**2) * (m - b * mu)


def c1_ceiling(p: Planted = PLANTED, n: int = 20000, seed: int = 0) -> float:
    """Bayes nRMSE for RT given the exact P3 and motor latencies (Monte Carlo, grid posterior)."""
    rng = np.random.default_rng(seed)
    med = p.rt_median * np.exp(rng.normal(0, p.rt_subject_sd, n))
    rt = np.clip(med * np.exp(rng.normal(0, p.rt_trial_sd, n)), p.rt_min, p.rt_max)
    lm = rt - p.motor_lead + rng.normal(0, p.motor_jitter, n)
    lp = rt + rng.normal(0, p.cpp_jitter, n)
    est = oracle_c1(lp, lm, p, seed)
    return float(np.sqrt(np.mean((est - rt) ** 2)) / rt.std())


def c2_ceiling(p: Planted = PLANTED) -> float:
    """Bayes nRMSE for externalizing given the subject's exact log alpha amplitude."""
    b, s, sd = p.alpha_beta, p.alpha_subject_sd, p.externalizing_sd
    # posterior variance of a Gaussian target measured as b*x + noise(s)
    post_var = 1.0 / (1.0 / sd**2 + b**2 / s**2)
    return float(np.sqrt(post_var) / sd)


def ceilings(p: Planted = PLANTED) -> dict[str, float]:
    """Best achievable nRMSE on the synthetic data: {"c1", "c2", "overall"} (lower is better)."""
    c1, c2 = c1_ceiling(p), c2_ceiling(p)
    return {"c1": round(c1, 4), "c2": round(c2, 4), "overall": round(0.3 * c1 + 0.7 * c2, 4)}
