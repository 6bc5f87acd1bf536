"""Measured outcomes per localization basis: {basis: (diagnoses, exactly right)}.

Written by ``python analysis/evaluate.py --random N --seed S --learn`` (see calibration.py);
do not edit by hand.
"""

TABLE: dict[str, tuple[int, int]] = {
    "CollectiveMismatch:cycle/cycle": (39, 39),
    "RankCommHang:cross-comm/node": (18, 18),
    "RankCommHang:exclusion/node/equivalent": (39, 39),
    "RankCommHang:none/suspects": (30, 0),
    "RankCommHang:p2p-pair/link/equivalent": (48, 15),
    "RankCommHang:peer-progress/link": (12, 12),
    "RankCommHang:peer-progress/link/equivalent": (15, 6),
    "RankCommHang:peer-progress/node": (3, 3),
    "RankCommHang:peer-progress/rank/equivalent": (6, 6),
    "RankCommHang:two-rank/link/equivalent": (15, 3),
    "RankCommSlow:cross-comm/node": (34, 32),
    "RankCommSlow:cross-comm/rank": (52, 51),
    "RankCommSlow:cross-comm/rank/equivalent": (1, 0),
    "RankCommSlow:exclusion/link": (10, 9),
    "RankCommSlow:exclusion/node": (2, 2),
    "RankCommSlow:exclusion/node/equivalent": (9, 9),
    "RankCommSlow:none/suspects/undecided": (2, 0),
    "RankCommSlow:p2p-pair/link/equivalent": (1, 0),
    "RankCommSlow:peer-progress/link": (1, 1),
    "RankCommSlow:peer-progress/link/equivalent": (18, 0),
    "RankCommSlow:peer-progress/rank": (14, 14),
    "RankLost:heartbeat/rank": (61, 59),
    "RankLost:heartbeat/suspects": (2, 0),
    "RankNonCommHang:arrival/rank": (91, 91),
    "RankNonCommHang:arrival/rank/missing": (13, 0),
    "RankNonCommSlow:arrival/rank": (85, 84),
    "RankNonCommSlow:arrival/rank/two-rank": (11, 10),
}
