"""Measured outcomes per localization basis: {basis: (diagnoses, exactly right)}.

Written by ``python analysis/evaluate.py --random N --seed S --learn`` (see calibration.py);
do not edit by hand.
"""

TABLE: dict[str, tuple[int, int]] = {
    "CollectiveMismatch:cycle/cycle": (72, 72),
    "RankCommHang:exclusion/node/equivalent": (6, 0),
    "RankCommHang:none/suspects": (12, 0),
    "RankCommHang:p2p-pair/link/equivalent": (106, 6),
    "RankCommHang:peer-progress/link": (6, 6),
    "RankCommHang:peer-progress/link/equivalent": (15, 0),
    "RankCommHang:peer-progress/node": (3, 3),
    "RankCommHang:two-rank/link/equivalent": (15, 3),
    "RankCommSlow:cross-comm/node": (3, 2),
    "RankCommSlow:cross-comm/rank": (93, 92),
    "RankCommSlow:cross-comm/rank/equivalent": (28, 28),
    "RankCommSlow:exclusion/link": (47, 6),
    "RankCommSlow:exclusion/node/equivalent": (6, 0),
    "RankCommSlow:none/suspects/undecided": (50, 0),
    "RankCommSlow:peer-progress/link": (8, 8),
    "RankCommSlow:peer-progress/link/equivalent": (18, 0),
    "RankCommSlow:peer-progress/rank": (14, 14),
    "RankLost:heartbeat/rank": (65, 63),
    "RankNonCommHang:arrival/rank": (119, 119),
    "RankNonCommHang:arrival/rank/missing": (1, 0),
    "RankNonCommSlow:arrival/rank": (93, 91),
    "RankNonCommSlow:arrival/rank/two-rank": (1, 1),
}
