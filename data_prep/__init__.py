"""data_prep: the EEG side of hybridnb — the challenge's windowing, exact and fast.

Never imports hybridnb. Modules (import the ones you need; nothing heavy happens at import):

* ``synthetic`` — writes an HBN-like BIDS release with planted, learnable structure
  (``make_hbn_like``, ``PLANTED``, ``ceilings``, ``FAULTS``).
* ``challenge1`` / ``challenge2`` — ``make_windows(...)`` -> ``windows.Windows`` (the official
  recipes; cached window store; problems collected, never fatal for other recordings).
* ``splits`` — subject-wise splits; ``scoring`` — nRMSE and the overall score.
* ``bids`` (find/read recordings, eegdash offline), ``participants`` (participants.tsv read
  robustly; what it cannot give, said once), ``events`` (checks and the trial table),
  ``bdf`` (fast BDF reader, edfio writer), ``official`` (the eegdash + braindecode pipeline,
  for parity and benchmarks).
"""
