"""What tests/test_notebooks.py reads from each notebook's kernel after its last cell, whichever
runs the notebooks (the project's runner, or nbval through tests/nbval_record.py)."""

# What the tests read from each notebook's kernel after its last cell: name -> expression over
# the notebook's own variables (the names are the notebook's; nothing is recorded for the tests)
READ = {
    "01_gpu_validation": {
        "verdicts": "verdicts",                       # simulated GPU -> (verdict, failed step)
        "fallback_device": "str(sim.device)",         # detect() with one wrong-matmul A100
        "fallback_reason": "sim.settings.reasons['device']",
        "forced_device": "str(forced.device)",        # detect() under HYBRIDNB_DEVICE=cpu
        "forced_precision": "forced.precision",
        "forced_reason": "forced.settings.reasons['device']"},
    "02_eeg_windowing_fixes": {
        "same": "same",                               # braindecode's windows == data_prep's
        "after_target": "after_target",
        "levels": "levels",                           # planted fault -> levels data_prep said
        "planted": "list(planted['fault'])"},
    "03_amp_compile_comparison": {
        "status": "status",                           # variant -> ok / skipped / failed
        "why_not": "why_not",                         # variant that did not run -> its note
        "hw_device": "str(hw.device)",
        "exact": "dict(zip(exact_df['variant'], exact_df['exact']))"},  # first-step check
    "04_challenge1_training": {
        "window_shape": "list(w1.shape[1:])", "window_dtype": "str(w1.X.dtype)",
        "after_target": "after_target", "k": "K", "subjects": "subjects",
        # fold -> part -> its subjects, as the notebook cut them; and its own checks of them
        "folds": "{i: {n: sorted(s) for n, s in p.items()} for i, p in parts.items()}",
        "shared": "shared", "tested_once": "tested_once",
        "c1": "c1", "c1_sd": "c1_sd", "per_fold": "per_fold.to_dict('index')",
        "table": "fold_table[['mean', 'sd']].to_dict('index')",
        "model": "model_name", "device": "str(trainer.device)",
        "recipe": "RECIPE.spec.name", "conv_nonlin": "RECIPE.spec.kwargs['conv_nonlin']",
        "target_mean": "target.mean", "target_std": "target.std"},
    "05_challenge2_training": {
        "window_shape": "list(w2.shape[1:])", "crop_shape": "list(x0.shape)",
        "one_target": "one_target", "k": "K",
        "subjects2": "sorted(set(w2.metadata['subject'].astype(str)))",
        "folds": "{i: {n: sorted(s) for n, s in p.items()} for i, p in parts2.items()}",
        "c1": "c1", "c2": "c2", "c2_sd": "c2_sd", "overall": "overall",
        "per_fold": "per_fold2.to_dict('index')",
        "table": "fold_table2[['mean', 'sd']].to_dict('index')",
        "c1_submitted": "c1_submitted", "c2_submitted": "c2_submitted",
        "c1_from": "str(c1_file) if c1_file.exists() else None",
        "fresh1": "fresh1", "fresh2": "fresh2", "zip_path": "str(zip_path.resolve())"},
}
