"""Event sequences of the HBN tasks for the synthetic release (see the reference, §3.4 and §8).

Each builder returns a :class:`~data_prep.synth_signal.Timeline`: the events.tsv rows (onset
rounded to the millisecond, ``duration`` "n/a"), the recording length in whole seconds, and the
bumps to plant in the signal.
"""

from __future__ import annotations

import math

import numpy as np

from .planted import PLANTED, Planted, sample_rt
from .synth_signal import Timeline

NA = "n/a"
CCD_ITIS = (2.8, 4.4, 6.0)
TARGET_S = 2.4


def _row(onset: float, value: str, code, **extra) -> dict:
    return {"onset": round(onset, 3), "duration": NA, "value": value,
            "event_code": code, **extra}


def _finish(tl: Timeline, last_s: float, tail_s: float = 2.0) -> Timeline:
    tl.n_seconds = int(math.ceil(last_s + tail_s))
    return tl


def ccd_run(rng: np.random.Generator, run: int, n_trials: int, rt_median: float,
            p: Planted = PLANTED, presses: bool = True, late_end: bool = False) -> Timeline:
    """contrastChangeDetection: trial start -> target after 2.8/4.4/6.0 s -> press 0.3–2.4 s later.

    About 5 % misses (no press), 5 % early ``non_target`` presses, 12 % wrong presses
    (``sad_face``); ``end_experiment`` 2.6 s after the last target.
    """
    tl = Timeline(n_seconds=0)
    fb = {"feedback": NA}
    tl.rows.append(_row(0.0, "break cnt", "break cnt", **fb))
    t = 1.0 + rng.uniform(0, 0.5)
    tl.rows.append(_row(t, f"contrastChangeB{run}_start", 93 + run, **fb))
    t += 1.0 + rng.uniform(0, 0.5)
    rts = sample_rt(rng, rt_median, n_trials, p)
    if late_end:
        rts[-1] = 0.8
    for i in range(n_trials):
        start = round(t, 3)
        iti = CCD_ITIS[rng.integers(3)]
        target = round(start + iti, 3)
        side = "left" if rng.random() < 0.5 else "right"
        tl.rows.append(_row(start, "contrastTrial_start", 5, **fb))
        u = 0.5 if (late_end and i == n_trials - 1) else rng.random()
        if presses and u < 0.05:   # early press before the target
            early = round(start + rng.uniform(0.5, iti - 0.3), 3)
            tl.rows.append(_row(early, f"{side}_buttonPress", 12 if side == "left" else 13,
                                feedback="non_target"))
            tl.bumps.append(("gauss", early - p.motor_lead, p.motor_width, p.motor_uv,
                             f"{_opp(side)}_motor"))
        tl.rows.append(_row(target, f"{side}_target", 8 if side == "left" else 9, **fb))
        tl.bumps.append(("gauss", target + 0.15, 0.05, p.visual_uv, "occipital"))
        if presses and not (0.05 <= u < 0.10):          # 5 % misses: no press at all
            rt = float(rts[i])
            wrong = rng.random() < 0.12
            pside = _opp(side) if wrong else side
            press = round(target + rt, 3)
            tl.rows.append(_row(press, f"{pside}_buttonPress", 12 if pside == "left" else 13,
                                feedback="sad_face" if wrong else "smiley_face"))
            peak = rt + rng.normal(0, p.cpp_jitter)
            tl.bumps.append(("ramp", target + p.cpp_start, target + max(peak, p.cpp_start + 0.05),
                             p.cpp_decay, p.cpp_uv * rng.uniform(0.7, 1.3), "parietal"))
            mlat = rt - p.motor_lead + rng.normal(0, p.motor_jitter)
            tl.bumps.append(("gauss", target + mlat, p.motor_width, p.motor_uv,
                             f"{_opp(pside)}_motor"))
            tl.bumps.append(("gauss", target + mlat, p.motor_width, p.motor_uv / 3,
                             f"{pside}_motor"))
            m = target + mlat + p.motor_lead          # beta: ERD before the press, rebound after
            tl.beta_gain.append((m - 0.4, m + 0.2, p.beta_erd))
            tl.beta_gain.append((m + 0.4, m + 1.0, p.beta_rebound))
        t = target + TARGET_S
    end = round(target + (0.9 if late_end else 2.6), 3)
    tl.rows.append(_row(end, "end_experiment", "n/a", **fb))
    return _finish(tl, end, tail_s=0.05 if late_end else 2.0)


def _opp(side: str) -> str:
    return "right" if side == "left" else "left"


def resting_state(rng: np.random.Generator, cycles: int, p: Planted = PLANTED,
                  open_s: float = 20.0, closed_s: float = 40.0) -> Timeline:
    """RestingState: resting_start, then ``cycles`` × (eyes open 20 s, eyes closed 40 s)."""
    tl = Timeline(n_seconds=0)
    tl.rows.append(_row(0.0, "break cnt", "break cnt"))
    t = 1.288
    tl.rows.append(_row(t, "resting_start", 90))
    t += rng.uniform(1.0, 3.0)
    for _ in range(cycles):
        tl.rows.append(_row(t, "instructed_toOpenEyes", 20))
        tl.rows.append(_row(t + open_s, "instructed_toCloseEyes", 30))
        tl.alpha_gain.append((t + open_s, t + open_s + closed_s, p.eyes_closed_gain))
        t += open_s + closed_s
    return _finish(tl, t, tail_s=1.0)


def surround_supp(rng: np.random.Generator, run: int, n_trials: int,
                  p: Planted = PLANTED) -> Timeline:
    """surroundSupp: block start, then fixpoint_ON / stim_ON pairs with the stimulus columns."""
    tl = Timeline(n_seconds=0)
    extra = {"background": NA, "foreground_contrast": NA, "stimulus_cond": NA}
    t = 1.0 + rng.uniform(0, 0.5)
    tl.rows.append(_row(t, f"surroundSuppB{run}_start", 92 + run * 5 % 7, **extra))
    for _ in range(n_trials):
        t += rng.uniform(1.0, 1.5)
        tl.rows.append(_row(t, "fixpoint_ON", 4, **extra))
        t += rng.uniform(0.8, 1.2)
        tl.rows.append(_row(t, "stim_ON", 8, background=int(rng.integers(2)),
                            foreground_contrast=float(rng.choice([0, 0.3, 0.6, 1])),
                            stimulus_cond=int(rng.integers(1, 4))))
        tl.bumps.append(("gauss", t + 0.12, 0.05, p.visual_uv * 1.5, "occipital"))
        t += 2.4
    return _finish(tl, t)


MOVIE_CODES = {"DiaryOfAWimpyKid": 81, "FunwithFractals": 82, "DespicableMe": 83,
               "ThePresent": 84}


def movie(rng: np.random.Generator, task: str, seconds: float) -> Timeline:
    """A movie task: video_start, video_stop after ``seconds``."""
    tl = Timeline(n_seconds=0)
    t = 1.0 + rng.uniform(0, 1.0)
    code = MOVIE_CODES[task]
    tl.rows.append(_row(t, "video_start", code))
    tl.rows.append(_row(t + seconds, "video_stop", code + 20))
    return _finish(tl, t + seconds)


def symbol_search(rng: np.random.Generator, n_pages: int) -> Timeline:
    """symbolSearch: start, newPage, trialResponse rows with answers."""
    tl = Timeline(n_seconds=0)
    extra = {"correct_answer": NA, "user_answer": NA}
    t = 1.0
    tl.rows.append(_row(t, "symbolSearch_start", 92, **extra))
    for _ in range(n_pages):
        t += rng.uniform(0.5, 1.0)
        tl.rows.append(_row(t, "newPage", 20, **extra))
        for _ in range(3):
            t += rng.uniform(1.5, 3.0)
            ans = int(rng.integers(2))
            tl.rows.append(_row(t, "trialResponse", 14, correct_answer=ans,
                                user_answer=ans if rng.random() < 0.9 else 1 - ans))
    return _finish(tl, t)


def seq_learning(rng: np.random.Generator, n_dots: int, n_blocks: int) -> Timeline:
    """seqLearning6target / 8target: learning blocks of dots turning on and off."""
    tl = Timeline(n_seconds=0)
    extra = {"correct_answer": NA, "user_answer": NA, "target_count": n_dots}
    t = 1.0
    tl.rows.append(_row(t, "seqLearning_start", 91, **extra))
    seq = rng.permutation(n_dots) + 1
    for b in range(1, n_blocks + 1):
        t += 1.0
        tl.rows.append(_row(t, f"learningBlock_{b}", 30 + b, **extra))
        for d in seq:
            t += 0.5
            tl.rows.append(_row(t, f"dot_no{d}_ON", 10 + int(d), **extra))
            t += 0.5
            tl.rows.append(_row(t, f"dot_no{d}_OFF", 20 + int(d), **extra))
        answer = "-".join(str(int(x)) for x in seq)
        t += 2.0
        tl.rows.append(_row(t, "learningBlock_end", "n/a", correct_answer=answer,
                            user_answer=answer, target_count=n_dots))
    return _finish(tl, t)
