"""Measured outcomes per localization basis: {basis: (diagnoses, exactly right)}.

Written by ``python analysis/evaluate.py --random N --seed S --learn`` (see calibration.py);
do not edit by hand. Empty: nothing measured yet, every basis keeps its capped prior.
"""

TABLE: dict[str, tuple[int, int]] = {}
