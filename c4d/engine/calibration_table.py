"""Measured outcomes per localization basis: {basis: (diagnoses, exactly right)}.

Written by ``python analysis/evaluate.py --random N --seed S --learn`` (see calibration.py);
do not edit by hand.
"""

TABLE: dict[str, tuple[int, int]] = {
    "CollectiveMismatch:cycle/cycle": (50, 50),
    "RankCommHang:exclusion/node/equivalent": (36, 36),
    "RankCommHang:none/suspects": (9, 0),
    "RankCommHang:p2p-pair/link/equivalent": (18, 3),
    "RankCommHang:peer-progress/link": (3, 3),
    "RankCommHang:peer-progress/link/equivalent": (3, 3),
    "RankCommHang:peer-progress/node": (3, 3),
    "RankCommHang:peer-progress/rank/equivalent": (6, 6),
    "RankCommHang:two-rank/link/equivalent": (15, 3),
    "RankCommSlow:cross-comm/node": (45, 45),
    "RankCommSlow:cross-comm/rank": (60, 60),
    "RankCommSlow:cross-comm/rank/equivalent": (4, 4),
    "RankCommSlow:exclusion/link": (25, 25),
    "RankCommSlow:exclusion/node/equivalent": (2, 2),
    "RankCommSlow:none/suspects/undecided": (6, 0),
    "RankCommSlow:peer-progress/link": (2, 2),
    "RankCommSlow:peer-progress/link/equivalent": (18, 0),
    "RankCommSlow:peer-progress/rank": (14, 14),
    "RankLost:heartbeat/rank": (51, 51),
    "RankLost:heartbeat/suspects": (4, 0),
    "RankNonCommHang:arrival/rank": (123, 121),
    "RankNonCommHang:arrival/rank/missing": (13, 0),
    "RankNonCommSlow:arrival/rank": (84, 82),
    "RankNonCommSlow:arrival/rank/two-rank": (14, 13),
}
